"""Replay: any system and the cost model over a recorded routing trace, with no model.

    python -m harness source=trace system=tide                    # the cached workload trace
    python -m harness source=trace trace.path=outputs/runs/X/trace.npz system=fiddler

With `trace.path: null` the trace is the cached gpu_only routing of this model, workload
and decode settings (recorded live on first use, then shared by every job of a sweep).
An explicit path is a `trace.npz` written by a live run with `trace.record=true`; its
calibration trace is the `calibration.npz` beside it.

The engine sees exactly what it saw live (the same loads, tokens, context and hints per
forward), so a replay gives the same counters and modeled time as the live run; a test
holds the two together. Replays have no numerics: there is no lossless check and no wall
clock throughput.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness.artifacts import calibration_trace, workload_trace
from harness.errors import HarnessError
from harness.fast_replay import replay_fast_or_exact
from harness.model import LLaDA2Config, LoadedModel, load_model, nominal_geometry
from harness.results import write_json_atomic
from harness.run import build_result, decode_settings, setup_run
from harness.trace import RoutingTrace
from harness.workload import load_prompts


def check_geometry(trace: RoutingTrace, geometry: LLaDA2Config, path: Path) -> None:
    if (trace.n_layers, trace.n_experts) != (geometry.n_moe_layers, geometry.num_experts):
        raise HarnessError(
            f"trace {path} has {trace.n_layers} MoE layers x {trace.n_experts} experts but model="
            f"{trace.meta.get('model', '?')} is configured; replay it with the model it was recorded with"
        )


def explicit_traces(path: Path, needs_calibration: bool) -> tuple[RoutingTrace, RoutingTrace | None]:
    trace = RoutingTrace.load(path)
    calibration = None
    if needs_calibration:
        beside = path.parent / "calibration.npz"
        if not beside.exists():
            raise HarnessError(f"this system learns from a calibration trace but there is no {beside}; "
                               "record the trace with a live run and trace.record=true")
        calibration = RoutingTrace.load(beside)
    return trace, calibration


def run_replay(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    settings = decode_settings(cfg)
    setup = setup_run(cfg, nominal_geometry(cfg.model))
    loaded: list[LoadedModel] = []

    def model() -> LoadedModel:  # only when a cached trace has to be recorded first
        if not loaded:
            loaded.append(load_model(cfg.model, cfg.cache_dir))
        return loaded[0]

    if cfg.trace.path is not None:
        path = Path(cfg.trace.path)
        trace, calibration = explicit_traces(path, setup.system.needs_calibration)
    else:
        prompts = load_prompts(cfg.workload, cfg.limit_prompts)
        trace, path = workload_trace(cfg, prompts, settings, model)
        calibration = calibration_trace(cfg, settings, model) if setup.system.needs_calibration else None
    check_geometry(trace, setup.geometry, path)

    engine = setup.engine()
    recorded = trace.meta.get("decode", {})  # steps per block as the decode ran them (clamped to gen_length)
    steps = min(int(recorded.get("steps", settings.steps)), int(recorded.get("gen_length", settings.gen_length)))
    engine.prepare(calibration, steps)
    start = time.perf_counter()
    replay_mode = replay_fast_or_exact(engine, trace).mode  # vectorized for fiddler and tide
    replay_s = time.perf_counter() - start
    counts = {
        "prompts": trace.meta.get("prompts", 0),
        "generated_tokens": trace.meta.get("generated_tokens", 0),
        "denoise_steps": trace.meta.get("denoise_steps", 0),
        "routed_tokens": sum(trace.n_tokens),
        "replay_s": replay_s,
        "layer_steps_per_s": len(trace) * trace.n_layers / replay_s if replay_s > 0 else 0.0,
    }
    result = build_result(cfg, setup, engine, counts, source="trace", weights=trace.meta.get("weights", "?"),
                          checkpoint=trace.meta.get("checkpoint", "?"))
    result["trace"] = str(path)
    if trace.meta.get("derived_from"):  # a no-cache trace derived from a prefix-cached recording
        result["trace_derived_from"] = trace.meta["derived_from"]
    result["replay"] = replay_mode
    write_json_atomic(run_dir / "result.json", result)
    return result
