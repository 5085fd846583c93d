"""How close generated routing comes to the trace it was fitted to, system by system
(docs/routing-regimes.md): each single-GPU system's modeled tokens/s and miss rate replayed
over the trace (with the calibration recorded beside it) and over the trace its regime
generates in the same shape (with generated calibration requests); then the routing
statistics of both traces: the fit's (harness/routing/moments.py, at the regime's period) and
a few of harness.traces.routing_stats' at B = a quarter of the experts, the entropy of the hints
DALI reads, the top-B drift TIDE's tau* reads (systems/tide_tau.py), how much of a block the top-B
set of its first step covers, and how often an expert of load 2 or 3 is routed again the next
denoising step (load 1: the solo_locality statistic).

    python -m harness.regimes.fidelity trace=<trace.npz> regime=<regime.yaml> [seed=0] [seeds=1]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

from harness.common.errors import exit_with
from harness.common.keyvalue import KeyValueCommand, Option, program_name, whole_number
from harness.placement.trace import RoutingTrace
from harness.regimes.grid import SINGLE, configs, replay
from harness.routing.generate import Dims
from harness.routing.moments import dali_hint_rows, hint_entropy, kept_at_load, trace_moments
from harness.routing.named import regime_file
from harness.routing.replayable import generate_with_calibration
from harness.traces.routing_stats import routing_statistics
from systems.tide_tau import denoise_blocks, estimate_drift, top_b_mask

COMMAND = KeyValueCommand(
    "python -m harness.regimes.fidelity", "each system's figures on a trace and on its fitted regime's routing",
    [Option("trace", "a recorded trace.npz (calibration.npz beside it)", required=True),
     Option("regime", "its fitted regime file (python -m harness.routing fit)", required=True),
     Option("seed", "the generator's (first) seed", "0"),
     Option("seeds", "generated traces (seeds seed, seed + 1, ...): the differences' mean and range", "1")],
    example="python -m harness.regimes.fidelity trace=tests/golden/mini/trace.npz regime=mini_fit")


ROUTING_STATS = ("top_b_share", "top_b_share_step", "distinct_experts_per_layer_step", "popularity_cv")
KEPT_LOADS = (2, 3)  # kept_load<v>: how often an expert of load v is routed again the next step (1: solo_locality)


def kept_by_load(blocks: list[torch.Tensor], load: int) -> float:
    """`kept_at_load` over TIDE's denoising blocks ([steps, L, E] each), one step apart. Mini's
    recorded routing keeps a light expert less often than per-slot reuse does at the same
    load-weighted overlap: the top-B drift TIDE reads (docs/routing-regimes.md)."""
    if not blocks:
        return math.nan
    now = np.concatenate([b[:-1].numpy() for b in blocks])
    after = np.concatenate([b[1:].numpy() for b in blocks])
    return kept_at_load(now, after, load)


def first_step_cover(blocks: list[torch.Tensor], capacity: int) -> float:
    """The share of a block's routed pairs after its first denoising step that fall on that
    step's top-`capacity` experts, over blocks ([steps, L, E] each): what TIDE serves from a
    refresh at a block's start when tau* spans the block (the masked state's experts are not
    the content's: docs/routing-regimes.md)."""
    held = [(top_b_mask(b[0], capacity), b[1:]) for b in blocks if b.shape[0] > 1]
    routed = sum(int(later.sum()) for _, later in held)
    return sum(int((later * top).sum()) for top, later in held) / routed if routed else math.nan


def fidelity(trace_path: Path, regime: str, seed: int = 0, seeds: int = 1) -> dict[str, dict[str, float]]:
    """Per system: tokens/s and miss rate on the trace and on its regime's generated routing at
    `seeds` seeds (seed, seed + 1, ...): the mean, and the generated minus trace difference's
    mean, min and max over them; under "routing statistics": each statistic on the trace and its
    mean on the generated traces. One seed says little on a short trace (mini's 8 requests: its
    systems moved 2-3 points from the fit's seed to the next three, docs/routing-regimes.md)."""
    trace = RoutingTrace.load(trace_path)
    beside = trace_path.parent / "calibration.npz"
    calibration = RoutingTrace.load(beside) if beside.exists() else None
    family = str(trace.meta["model"])
    fitted = regime_file(regime)
    generated = [generate_with_calibration(fitted, family, None, s, 2, dims=Dims.of_trace(trace))
                 for s in range(seed, seed + seeds)]
    out = {}
    for system, cfg in configs(family, SINGLE).items():
        a = replay(cfg, trace, calibration)
        runs = [replay(cfg, g, g_calibration) for g, g_calibration in generated]
        ratios = [b["tokens_per_s"] / a["tokens_per_s"] - 1 if a["tokens_per_s"] else 0.0 for b in runs]
        out[system] = {"tokens_per_s": a["tokens_per_s"],
                       "tokens_per_s_generated": float(np.mean([b["tokens_per_s"] for b in runs])),
                       "tokens_per_s_ratio": float(np.mean(ratios)),
                       "tokens_per_s_ratio_min": min(ratios), "tokens_per_s_ratio_max": max(ratios),
                       "miss_rate": a["miss_rate"],
                       "miss_rate_generated": float(np.mean([b["miss_rate"] for b in runs]))}
    period = int(fitted.regime.period)
    each = [trace_statistics(g, period) for g, _ in generated]
    out["routing statistics"] = {**trace_statistics(trace, period),
                                 **{f"{k}_generated": float(np.mean([e[k] for e in each])) for k in each[0]}}
    return out


def trace_statistics(trace: RoutingTrace, period: int) -> dict[str, float]:
    """The statistics the fidelity table shows of one trace (module docstring), nan where a
    statistic does not apply (an autoregressive trace's denoising ones)."""
    b = max(1, trace.n_experts // 4)
    seen = routing_statistics(trace, b)
    blocks = denoise_blocks(trace)
    _, hints = dali_hint_rows(trace)  # how flat the hints DALI reads are
    stats = {**trace_moments(trace, period), **{k: seen[k] for k in ROUTING_STATS},
             "cosine_k1": (seen["cosine_by_k"] or [None])[0],
             "hint_entropy": hint_entropy(hints) if hints is not None else None,
             "top_b_drift": estimate_drift(blocks, b) if blocks else None,
             "first_step_cover": first_step_cover(blocks, b) if blocks else None,
             **{f"kept_load{v}": kept_by_load(blocks, v) if blocks else None for v in KEPT_LOADS}}
    return {k: float("nan") if v is None else float(v) for k, v in stats.items()}


def main(argv: list[str]) -> int:
    COMMAND.prog = program_name(COMMAND.prog)
    args = COMMAND.parse(argv)
    seed = whole_number(args, "seed")
    seeds = whole_number(args, "seeds", 1, "how many generated traces")
    rows = fidelity(Path(args["trace"]), args["regime"], seed, seeds)
    stats = rows.pop("routing statistics")
    several = seeds > 1
    mean = f", mean of {seeds} seeds" if several else ""
    print(f"| system | tokens/s (trace) | tokens/s (generated{mean}) | difference{mean} |"
          + (" range over the seeds |" if several else "") + " miss (trace) | miss (generated) |")
    print("|---" * (6 + several) + "|")
    for system, r in rows.items():
        spread = f" {r['tokens_per_s_ratio_min']:+.1%}..{r['tokens_per_s_ratio_max']:+.1%} |" if several else ""
        print(f"| {system} | {r['tokens_per_s']:.2f} | {r['tokens_per_s_generated']:.2f} | "
              f"{r['tokens_per_s_ratio']:+.1%} |{spread} {r['miss_rate']:.3f} | {r['miss_rate_generated']:.3f} |")
    print(f"\n| routing statistic | trace | generated{mean} |\n|---|---|---|")
    for key in (k for k in stats if not k.endswith("_generated")):
        print(f"| {key} | {stats[key]:.4g} | {stats[key + '_generated']:.4g} |")
    return 0


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
