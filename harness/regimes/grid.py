"""The regime map's grid and its replays (docs/routing-regimes.md): for each model family,
routing generated at every point of locality x skew x cross-request sharing (the family's
fitted anchor supplying the other knobs), replayed in this process under every single-GPU
system, and gem against ep_linear on `topology=multi` with lock-step batches. Modeled
figures (the cost model over the family's geometry), as every replay's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from harness.accounting.budget import BYTES_PER_PARAM, GB
from harness.cli.overrides import compose_checked
from harness.job.config import register_configs
from harness.job.setup import setup_run
from harness.placement.trace import RoutingTrace
from harness.routing.generate import Dims
from harness.routing.named import anchor_of
from harness.routing.params import RANGES, RegimeFile, RoutingRegime
from harness.routing.replayable import generate_with_calibration, mode_of
from harness.traces.batch_replay import replay_trace
from harness.traces.importing import model_geometry
from harness.traces.serving import lockstep
from harness.zoo.entry import nominal_geometry

LOCALITY = (0.0, 0.3, 0.6, 0.9)
SKEW = (0.3, 0.8, 1.4)
SHARED = (0.2, 0.8)
FAMILIES = ("mini", "qwen3_moe", "mixtral", "diffusiongemma")
SINGLE = ("fiddler", "static_split", "mixtral_offload", "dali", "tide", "tide_adaptive", "tide_sequential",
          "oracle")
BASELINES = ("fiddler", "static_split", "mixtral_offload")  # what a paper's system is measured against
MULTI = ("ep_linear/low", "gem/low", "ep_linear/high", "gem/high")  # system/GPU speed variability
SIZES = {"ar": dict(requests=4, prompt=32, gen=32), "block": dict(requests=2, prompt=32, gen=64),
         "canvas": dict(requests=2, prompt=32, gen=64)}
BATCH = 4
GEM_STARTS = 1  # GEM's noisy starts (default 4): its map search dominates a cell's replays


@dataclass
class Cell:
    family: str
    point: dict[str, float]  # locality, skew, shared (and "anchor": True at the fitted point)
    figures: dict[str, dict[str, float]]  # system -> tokens_per_s, miss_rate, modeled_time_s, tau_star


def anchor(family: str) -> RegimeFile:
    """The family's fitted regime (conf/routing/<family>_fit.yaml), or the defaults."""
    return anchor_of(family)


def points(base: RoutingRegime) -> list[dict[str, float]]:
    grid = [{"locality": lo, "skew": sk, "shared": sh} for sh, sk, lo in itertools.product(SHARED, SKEW, LOCALITY)]
    fitted = {"locality": base.locality, "skew": base.skew, "shared": base.shared, "anchor": 1.0}
    return [*grid, {**fitted, "lognormal": 1.0} if base.lognormal else fitted]


def budget_overrides(family: str) -> list[str]:
    """B = a quarter of the experts per layer, with the GPU memory that holds them (as
    harness.real_routing sizes its cells)."""
    geometry, _ = model_geometry(family, None)
    b = max(1, geometry.num_experts // 4)
    need = geometry.non_expert_bytes(BYTES_PER_PARAM) + 0.5 * GB + b * geometry.n_moe_layers \
        * geometry.expert_bytes(BYTES_PER_PARAM)
    return ["budget=custom", f"budget.experts_per_layer={b}", f"budget.gpu_gb={-(-need * 100 // GB) / 100}"]


def configs(family: str, systems: tuple[str, ...]) -> dict[str, Any]:
    """A typed config per system (composed once: every cell replays with it)."""
    register_configs()
    base = [f"model={family}", "source=trace", "routing=recorded", "tracking.enabled=false", "show_text=false",
            *budget_overrides(family)]
    out = {}
    for system in systems:
        name, _, variability = system.partition("/")
        multi = ["topology=multi", f"topology.variability={variability}", f"workload.batch={BATCH}",
                 *([f"system.starts={GEM_STARTS}"] if name == "gem" else [])] if variability else []
        out[system] = compose_checked([*base, f"system={name}", *multi])
    return out


def replay(cfg: Any, trace: RoutingTrace, calibration: RoutingTrace | None) -> dict[str, float]:
    setup = setup_run(cfg, nominal_geometry(cfg.model))
    if cfg.workload.batch > 1:
        trace = lockstep(trace, cfg.workload.batch).trace
        calibration = lockstep(calibration, cfg.workload.batch).trace if calibration is not None else None
    engine = setup.engine()
    engine.prepare(calibration if setup.needs_calibration else None, _steps(trace))
    replay_trace(engine, trace)
    summary = engine.summary()
    modeled = float(summary["modeled_time_s"])
    report = setup.system.report()
    return {"tokens_per_s": trace.meta["generated_tokens"] / modeled if modeled > 0 else 0.0,
            "miss_rate": float(summary.get("miss_rate", 0.0)), "modeled_time_s": modeled,
            "tau_star": float(report["tau_star"]) if isinstance(report.get("tau_star"), int | float) else -1.0}


def _steps(trace: RoutingTrace) -> int:
    decode = trace.meta.get("decode", {})
    return int(decode.get("steps", 32))


LOCALITY_SHARES = ("solo_locality", "masked_locality")  # reuse knobs that follow the locality axis


def reuse_at(anchor: RoutingRegime, knob: str, locality: float) -> float | None:
    """A reuse knob of LOCALITY_SHARES at a grid point of this locality: the anchor's ratio of
    it to its locality (unset stays unset; an anchor without reuse: the point's locality)."""
    value = getattr(anchor, knob)
    if value is None:
        return None
    ratio = value / anchor.locality if anchor.locality > 0 else 1.0
    return min(RANGES[knob][1], locality * ratio)


def family_cells(family: str, systems: tuple[str, ...] = (*SINGLE, *MULTI), seed: int = 0) -> list[Cell]:
    """Every grid point of one family under every system."""
    fitted = anchor(family)
    cfgs = configs(family, systems)
    dims = Dims.of_model(family)
    cells = []
    for point in points(fitted.regime):
        knobs = {k: v for k, v in point.items() if k != "anchor"}
        if "anchor" not in point:  # the locality axis is the neighbour's reuse (a fitted period 2 kept at the anchor)
            knobs["period"] = 1.0
            # and the shared axis is the calibration's too (the anchor keeps its fitted calibration_shared)
            knobs["calibration_shared"] = None
            # and the skew axis is a Zipf exponent in every family (the anchor keeps its fitted shape)
            knobs["lognormal"] = None
            # and a lone expert's reuse, and a masked token's, keep their fitted share of the axis' reuse
            knobs.update({k: reuse_at(fitted.regime, k, point["locality"]) for k in LOCALITY_SHARES})
        regime = RegimeFile(replace(fitted.regime, **knobs), fitted.shape, {}, f"{family}_grid")
        any_cfg = next(iter(cfgs.values()))
        sizes = SIZES[_mode(family)]
        trace, calibration = generate_with_calibration(
            regime, family, None, seed, 2, sizes["requests"], sizes["prompt"],
            sizes["gen"], any_cfg.decode.block_length, any_cfg.decode.cache, dims)
        cells.append(Cell(family, point, {s: replay(c, trace, calibration) for s, c in cfgs.items()}))
    return cells


def _mode(family: str) -> str:
    return mode_of(family)
