"""Benchmark: how fast each system plans, in replay, against the model's own forward.

    python -m harness.bench [model=mini] [trace=<trace.npz>] [steps=256] [budget=10GB] [forward=true]

For every system, replays a routing trace through the engine (validation, residency,
cost model: everything but the numerics) and prints layer-steps per second, the time
spent inside `System.plan` per layer-step, the engine's own bookkeeping per layer-step
as it measures it (`OffloadEngine.host_seconds`: decide + account without the plan,
`own_ms_per_layer_step`), for the systems with a vectorized replay
(harness/fast_replay.py: fiddler, tide) its layer-steps per second, its ratio to the
engine's and whether its summary equals the engine's (`fast_exact`), and, with
forward=true, the ratio of that planning time to the proxy model's forward time per
layer measured in the same process.
Without trace=, a synthetic trace with the model's nominal geometry is used: each step
routes `tokens` tokens whose expert preferences drift slowly (like real denoising steps).
Numbers are wall-clock on this machine; compare ratios, not absolute times.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch

from harness.budget import resolve_budget
from harness.cli_check import compose_checked
from harness.config import register_configs
from harness.cost import CostModel, load_hardware
from harness.decoding import StepInfo
from harness.engine import OffloadEngine
from harness.errors import HarnessError, exit_with
from harness.fast_replay import fast_path_refusal, fast_replay, summary_differences
from harness.model import LLaDA2Config, nominal_geometry
from harness.trace import RoutingTrace
from systems.registry import SYSTEMS, make_system

BENCH_SYSTEMS = ("gpu_only", "fiddler", "mixtral_offload", "tide", "oracle")
ARGS = {"model": "mini", "trace": None, "steps": "256", "budget": "10GB", "forward": "true", "tokens": "32",
        "systems": ",".join(BENCH_SYSTEMS)}


def synthetic_trace(geometry: LLaDA2Config, steps: int, tokens: int, block: int = 32, seed: int = 0) -> RoutingTrace:
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


class TimedSystem:
    """Wraps a system's plan() to accumulate the seconds spent in it."""

    def __init__(self, system) -> None:
        self.system, self.seconds = system, 0.0
        inner = system.plan

        def plan(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        system.plan = plan


def bench_system(name: str, trace: RoutingTrace, geometry: LLaDA2Config, b: int, cost: CostModel) -> dict:
    system = make_system(name, {})
    timed = TimedSystem(system)
    engine = OffloadEngine(system, geometry, b, cost)
    start = time.perf_counter()
    engine.prepare(trace if system.needs_calibration else None, 32)
    prepare_s = time.perf_counter() - start
    start = time.perf_counter()
    summary = engine.replay(trace)
    replay_s = time.perf_counter() - start
    layer_steps = len(trace) * trace.n_layers
    own_s = engine.host_seconds()["host_engine_s"]
    return {"system": name, "layer_steps": layer_steps, "layer_steps_per_s": layer_steps / replay_s,
            "plan_ms_per_layer_step": 1e3 * timed.seconds / layer_steps,
            "engine_ms_per_layer_step": 1e3 * replay_s / layer_steps,
            "own_ms_per_layer_step": 1e3 * own_s / layer_steps, "prepare_s": prepare_s,
            **bench_fast(name, trace, geometry, b, cost, summary, layer_steps / replay_s)}


def bench_fast(name: str, trace: RoutingTrace, geometry: LLaDA2Config, b: int, cost: CostModel, engine_summary: dict,
               engine_rate: float) -> dict:
    """The vectorized replay (harness/fast_replay.py) of a fresh copy of the system, where
    it has one: layer-steps/s, the ratio to the engine's, and whether the summaries agree."""
    system = make_system(name, {})
    engine = OffloadEngine(system, geometry, b, cost)
    engine.prepare(trace if system.needs_calibration else None, 32)
    if fast_path_refusal(engine, trace) is not None:
        return {"fast_layer_steps_per_s": float("nan"), "fast_vs_engine": float("nan"), "fast_exact": None}
    start = time.perf_counter()
    summary = fast_replay(engine, trace)
    rate = len(trace) * trace.n_layers / (time.perf_counter() - start)
    return {"fast_layer_steps_per_s": rate, "fast_vs_engine": rate / engine_rate,
            "fast_exact": not summary_differences(engine_summary, summary)}


def forward_ms_per_layer(model_name: str, tokens: int) -> float:
    """Proxy model forward over one block of `tokens` tokens, per layer (median of 5)."""
    cfg = compose_checked([f"model={model_name}"])
    from harness.model import load_model

    loaded = load_model(cfg.model, cfg.cache_dir)
    ids, pos = torch.arange(tokens) % 100, torch.arange(tokens)
    loaded.model(ids, pos, tokens)  # warm-up
    times = []
    for _ in range(5):
        start = time.perf_counter()
        loaded.model(ids, pos, tokens)
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[2] / loaded.model.config.num_hidden_layers


COUNT_LIMITS = {"steps": 100_000, "tokens": 4096}  # synthetic trace size: forwards, tokens per forward


def parse(argv: list[str]) -> dict[str, str | None]:
    args = dict(ARGS)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in ARGS:
            raise HarnessError(f"argument {arg!r} is not one of {', '.join(f'{k}=' for k in ARGS)}")
        args[key] = value
    for key, upper in COUNT_LIMITS.items():
        count(args, key, upper)
    if args["forward"] not in ("true", "false"):
        raise HarnessError(f"forward={args['forward']!r} must be true or false")
    return args


def count(args: dict[str, str | None], key: str, upper: int) -> int:
    """A positive integer argument up to `upper`."""
    text = str(args[key])
    if not text.isdigit() or not 1 <= int(text) <= upper:
        raise HarnessError(f"{key}={text!r} must be an integer between 1 and {upper}")
    return int(text)


def main(argv: list[str]) -> int:
    register_configs()
    args = parse(argv)
    cfg = compose_checked([f"model={args['model']}", f"budget={args['budget']}"])
    geometry = nominal_geometry(cfg.model)
    cost = CostModel(geometry, load_hardware(cfg.hardware, geometry))
    b = resolve_budget(cfg.budget, geometry).experts_per_layer
    if args["trace"]:
        from harness.replay import check_geometry

        trace = RoutingTrace.load(Path(args["trace"]))
        check_geometry(trace, geometry, Path(args["trace"]), str(args["model"]))
    else:
        trace = synthetic_trace(geometry, count(args, "steps", COUNT_LIMITS["steps"]),
                                count(args, "tokens", COUNT_LIMITS["tokens"]))
    names = [n for n in str(args["systems"]).split(",") if n]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise HarnessError(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    rows = [bench_system(n, trace, geometry, b, cost) for n in names]
    table = pd.DataFrame(rows)
    title = f"replay benchmark: model={args['model']} B={b} trace={args['trace'] or 'synthetic'} " \
            f"({len(trace)} forwards x {trace.n_layers} layers)"
    if args["forward"] == "true":
        fwd = forward_ms_per_layer(str(args["model"]), int(args["tokens"]))
        table["plan_vs_forward"] = table["plan_ms_per_layer_step"] / fwd
        title += f"; proxy forward {fwd:.3f} ms/layer ({args['tokens']} tokens)"
    print(title)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
