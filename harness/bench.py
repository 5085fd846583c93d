"""Benchmark: how fast each system plans, live and in replay, against the model's forward.

    python -m harness.bench [model=mini] [trace=<trace.npz>] [steps=256] [budget=10GB] [forward=true]
                            [systems=a,b,...] [repeats=3] [format=table|json]

Per system, over a routing trace (everything but the numerics):

- live_us_per_layer_step: the live path's cost per MoE layer per forward (System.plan,
  plan validation and residency, the ledger's recording and its charge of the forwards),
  the engine driven layer by layer as a live run drives it; the median of `repeats` runs
  (the upper one of an even count), each with a fresh system; plan_us_per_layer_step: the part inside `System.plan`, and
  engine_us_per_layer_step: the engine's own part (plan checks, residency, the ledger's
  recording and charges), both from the same run (the rest is the replay loop's);
  live_us_best: the fastest of the runs (on a machine whose speed drifts, the steadiest
  figure: it needs only one undisturbed run);
- replay_layer_steps_per_s: a replay's speed (harness/traces/batch_replay.py: in batch where the
  system plans in batch, `replay_mode` fast, else layer by layer, the live figure), and
  `replay_exact`: whether the replay's summary equals the live path's bit for bit;
- with forward=true, plan_vs_forward: the live path's time over the proxy model's forward
  time per layer measured in the same process.

Without trace=, a synthetic trace with the model's nominal geometry is used: each step
routes `tokens` tokens whose expert preferences drift slowly (like real denoising steps).
Numbers are wall-clock on this machine; compare ratios, not absolute times.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from harness.accounting.budget import resolve_budget
from harness.accounting.cost import CostModel
from harness.accounting.profiling import load_hardware
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError, exit_with
from harness.common.keyvalue import KeyValueCommand, Option, program_name
from harness.engine.engine import OffloadEngine
from harness.job.config import register_configs
from harness.job.replay import check_geometry
from harness.placement.steps import StepInfo
from harness.placement.system import MoEGeometry
from harness.placement.trace import RoutingTrace
from harness.traces.batch_replay import replay_trace, summary_differences
from harness.zoo.entry import load_model, nominal_geometry
from systems.registry import REGISTRY, SYSTEMS, entry_of, make_system

BENCH_SYSTEMS = tuple(name for name, entry in REGISTRY.items() if not entry.multi_gpu)  # one-GPU systems
ARGS = {"model": "mini", "trace": None, "steps": "256", "budget": "10GB", "forward": "true", "tokens": "32",
        "systems": ",".join(BENCH_SYSTEMS), "repeats": "3", "format": "table"}
FORMATS = ("table", "json")


def synthetic_trace(geometry: MoEGeometry, steps: int, tokens: int, block: int = 32, seed: int = 0) -> RoutingTrace:
    """Tokens with fixed per-layer preference logits that drift a little each step."""
    g = torch.Generator().manual_seed(seed)
    layers, experts, k = geometry.n_moe_layers, geometry.num_experts, geometry.num_experts_per_tok
    trace = RoutingTrace(layers, experts, geometry=geometry.to_dict(), meta={"purpose": "synthetic"})
    prefs = torch.randn(layers, tokens, experts, generator=g)
    for s in range(steps):
        blk, step = divmod(s, block)
        if step == 0:
            prefs = torch.randn(layers, tokens, experts, generator=g)
        prefs = prefs + 0.3 * torch.randn(prefs.shape, generator=g)
        trace.add_step(StepInfo(0, blk, step, s, blk == 0), tokens, tokens * (blk + 1))
        top = prefs.topk(k, dim=-1).indices  # [L, T, k]
        for layer in range(layers):
            trace.record(layer, torch.bincount(top[layer].reshape(-1), minlength=experts))
    return trace


def _prepared_engine(name: str, trace: RoutingTrace, geometry: MoEGeometry, b: int,
                     cost: CostModel) -> OffloadEngine:
    system = make_system(name, {})
    engine = OffloadEngine(system, geometry, b, cost)
    engine.prepare(trace if entry_of(system).needs_calibration(system) else None, 32)
    return engine


def live_run(name: str, trace: RoutingTrace, geometry: MoEGeometry, b: int,
             cost: CostModel) -> tuple[float, float, float, dict]:
    """(seconds, seconds inside System.plan, the engine's own seconds, summary) of the
    live path over `trace`."""
    engine = _prepared_engine(name, trace, geometry, b, cost)
    start = time.perf_counter()
    summary = engine.replay(trace)  # layer by layer, as a live run's MoE layers drive it
    host = engine.host_seconds()
    return time.perf_counter() - start, host["host_plan_s"], host["host_engine_s"], summary


def bench_system(name: str, trace: RoutingTrace, geometry: MoEGeometry, b: int, cost: CostModel,
                 repeats: int = 3) -> dict:
    layer_steps = len(trace) * trace.n_layers
    runs = sorted((live_run(name, trace, geometry, b, cost) for _ in range(repeats)), key=lambda r: r[0])
    live_s, plan_s, engine_s, live_summary = runs[len(runs) // 2]
    engine = _prepared_engine(name, trace, geometry, b, cost)
    start = time.perf_counter()
    summary, mode = replay_trace(engine, trace)
    replay_s = time.perf_counter() - start if mode == "fast" else live_s
    return {"system": name, "layer_steps": layer_steps, "live_us_per_layer_step": 1e6 * live_s / layer_steps,
            "plan_us_per_layer_step": 1e6 * plan_s / layer_steps,
            "engine_us_per_layer_step": 1e6 * engine_s / layer_steps,
            "live_us_best": 1e6 * runs[0][0] / layer_steps,
            "replay_layer_steps_per_s": layer_steps / replay_s,
            "replay_mode": mode, "replay_exact": not summary_differences(live_summary, summary, rel=0.0)}


def forward_ms_per_layer(model_name: str, tokens: int) -> float:
    """Proxy model forward over one block of `tokens` tokens, per layer (median of 5)."""
    cfg = compose_checked([f"model={model_name}"])

    loaded = load_model(cfg.model, cfg.cache_dir)
    ids, pos = torch.arange(tokens) % 100, torch.arange(tokens)
    loaded.model(ids, pos, tokens)  # warm-up
    times = []
    for _ in range(5):
        start = time.perf_counter()
        loaded.model(ids, pos, tokens)
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[2] / loaded.model.config.num_hidden_layers


# synthetic trace size (forwards, tokens per forward) and live runs per system
COUNT_LIMITS = {"steps": 100_000, "tokens": 4096, "repeats": 101}


COMMAND = KeyValueCommand("python -m harness.bench", "how fast each system plans, live and in replay", [
    Option("model", "the geometry charged: tiny | mini | flash", ARGS["model"]),
    Option("trace", "a recorded trace.npz (default: a synthetic trace of the model's geometry)"),
    Option("steps", "forwards of the synthetic trace", ARGS["steps"]),
    Option("budget", "the budget config (10GB, 18GB, 30GB, 55GB, custom)", ARGS["budget"]),
    Option("forward", "also time the proxy model's forward: true | false", ARGS["forward"]),
    Option("tokens", "tokens per forward of the synthetic trace", ARGS["tokens"]),
    Option("systems", "comma-separated systems", ARGS["systems"]),
    Option("repeats", "live runs per system (the median is reported)", ARGS["repeats"]),
    Option("format", "table | json", ARGS["format"]),
], example="python -m harness.bench model=mini systems=fiddler,tide forward=false")


def parse(argv: list[str]) -> dict[str, str | None]:
    COMMAND.prog = program_name(COMMAND.prog)
    args: dict[str, str | None] = dict(ARGS)
    args.update(COMMAND.parse(argv))
    for key, upper in COUNT_LIMITS.items():
        count(args, key, upper)
    if args["forward"] not in ("true", "false"):
        raise HarnessError(f"forward={args['forward']!r} must be true or false")
    return args


def count(args: dict[str, str | None], key: str, upper: int) -> int:
    """A positive integer argument up to `upper`."""
    text = str(args[key])
    # str.isdigit() accepts '²' and '٣', which int() refuses or reads: only ASCII digits
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= upper:
        raise HarnessError(f"{key}={text!r} must be an integer between 1 and {upper}")
    return int(text)


def main(argv: list[str]) -> int:
    register_configs()
    args = parse(argv)
    cfg = compose_checked([f"model={args['model']}", f"budget={args['budget']}"])
    geometry = nominal_geometry(cfg.model)
    cost = CostModel(geometry, load_hardware(cfg.hardware, geometry))
    b = resolve_budget(cfg.budget, geometry, cfg.model.entry.capabilities.paper_budgets).experts_per_layer
    if args["trace"]:
        trace = RoutingTrace.load(Path(args["trace"]))
        check_geometry(trace, geometry, Path(args["trace"]), str(args["model"]))
    else:
        trace = synthetic_trace(geometry, count(args, "steps", COUNT_LIMITS["steps"]),
                                count(args, "tokens", COUNT_LIMITS["tokens"]))
    names = [n for n in str(args["systems"]).split(",") if n]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise HarnessError(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    if args["format"] not in FORMATS:
        raise HarnessError(f"format={args['format']} is not one of {', '.join(FORMATS)}")
    repeats = count(args, "repeats", COUNT_LIMITS["repeats"])
    rows = [bench_system(n, trace, geometry, b, cost, repeats) for n in names]
    setting = {"model": args["model"], "experts_per_layer": b, "trace": args["trace"] or "synthetic",
               "forwards": len(trace), "moe_layers": trace.n_layers}
    if args["forward"] == "true":
        fwd = forward_ms_per_layer(str(args["model"]), int(args["tokens"]))
        setting["proxy_forward_us_per_layer"] = 1e3 * fwd
        for row in rows:
            row["plan_vs_forward"] = row["live_us_per_layer_step"] / (1e3 * fwd)
    if args["format"] == "json":
        print(json.dumps({**setting, "systems": {row.pop("system"): row for row in rows}}, indent=1))
        return 0
    print("planning benchmark: " + " ".join(f"{k}={v}" for k, v in setting.items()))
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


def cli() -> None:
    """The console script's entry point."""
    exit_with(main, sys.argv[1:])


if __name__ == "__main__":
    cli()
