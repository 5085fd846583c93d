"""One run: load the model, decode the workload under a system, write result.json.

Data flow (docs/architecture.md):
  config -> model (real weights at model.path, else a cached proxy)
         -> calibration trace (gpu_only routing of the calibration prompts, cached) if the
            system learns from one -> system.prepare() through the engine
         -> decode every workload prompt with the common loop; each MoE layer asks the
            engine, which asks the system for a plan, checks it and charges the cost model
         -> compare tokens with the cached gpu_only reference (lossless)
         -> result.json in the run directory (atomically) -> summary line
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path

from harness.decode.decode_batch import DecodeBatch, decode_with_engine, encode_checked
from harness.decode.decoding import steps_per_block
from harness.decode.loading import LoadedModel
from harness.decode.lossless import compare_tokens, load_reference, store_reference
from harness.decode.workload import load_prompts, workload_record
from harness.engine.engine import OffloadEngine
from harness.hybrid.executor import HybridExecutor
from harness.hybrid.repeats import TimingConfig, repeat_figures, run_repeats
from harness.job.artifacts import artifact_key, calibration_trace, describe_batch, model_identity, new_trace
from harness.job.config import HarnessConfig
from harness.job.execution import Execution
from harness.job.replay import run_replay
from harness.job.setup import build_result, setup_run
from harness.results.run_result import DecodedOutputs, RunIdentity, RunResult
from harness.traces.routing_stats import statistics_with_uniform
from harness.zoo.entry import nominal_geometry


def run_job(cfg: HarnessConfig, run_dir: str | Path) -> RunResult:
    """Run one configuration and write `result.json` into `run_dir`: live by default,
    over a recorded routing trace with `source=trace`. `cfg` was checked when it was built.
    The result records when the job started and finished (MLflow's Duration column)."""
    started = time.time()
    result = run_replay(cfg, run_dir) if cfg.source == "trace" else run_live(cfg, run_dir)
    result.started_at, result.finished_at, result.run_dir = started, time.time(), Path(run_dir)
    result.save_json(Path(run_dir) / "result.json")
    return result


def add_repeat_figures(result: RunResult, times_s: list[float], timing: TimingConfig) -> None:
    """The repeats' p50/p90 into the measured result's timing; tokens_per_s is the p50 rate."""
    figures = repeat_figures(times_s, int(result.metrics["generated_tokens"]), timing)
    result.timing.figures.update(figures)
    if not math.isnan(figures["measured_tokens_per_s_p50"]):
        result.metrics["tokens_per_s"] = figures["measured_tokens_per_s_p50"]


def run_live(cfg: HarnessConfig, run_dir: str | Path) -> RunResult:
    """Decode the workload under the engine; the result (not yet written: run_job writes it)."""
    run_dir = Path(run_dir)
    prompts = load_prompts(cfg.workload, cfg.limit_prompts)
    settings = cfg.decode
    setup = setup_run(cfg, nominal_geometry(cfg.model))
    # host or device: every backend-dependent step asks it (auto: the host for a model the device does not serve)
    on_device = cfg.model.entry.capabilities.device_backend
    execution = Execution.choose("cpu" if not on_device and cfg.backend == "auto" else cfg.backend)
    t0 = time.perf_counter()
    loaded = execution.load(cfg)
    load_s = time.perf_counter() - t0
    encode_checked(loaded, prompts, settings, "workload")  # a prompt too long fails before any decoding

    def model() -> LoadedModel:
        return loaded

    record = cfg.trace.record
    calibration = None
    if setup.needs_calibration or record:
        calibration = calibration_trace(cfg, settings, model, execution.backend)
    # a device's reference is computed by its own kernels: CPU kernels round differently
    ref_key = execution.cache_key(artifact_key(cfg, settings, prompts))
    reference = load_reference(cfg.cache_dir, ref_key, settings.reference_shape(len(prompts)))
    if reference is None and setup.system.name != "gpu_only":
        reference = execution.reference_tokens(loaded, setup.cost, prompts, settings)
        store_reference(cfg.cache_dir, ref_key, reference, model_identity(cfg))

    trace = new_trace(loaded, cfg, settings, "workload") if record else None
    # DALI's measures read the routing: kept in memory when it is not recorded
    routing = trace if trace is not None or not setup.measures else new_trace(loaded, cfg, settings, "measures")

    def decode_once(last: bool) -> tuple[OffloadEngine, OffloadEngine | HybridExecutor, DecodeBatch]:
        engine = setup.engine(routing if last else None)
        engine.prepare(calibration if setup.needs_calibration else None, steps_per_block(settings))
        runner = execution.runner(loaded, engine)  # kept: its measured figures go into the result
        batch = decode_with_engine(loaded, runner, prompts, settings, desc=setup.system.name)
        execution.close(runner)
        return engine, runner, batch

    # a device measures: warm-up decodes, then repeats (harness/hybrid/repeats.py); the host models once
    runs = run_repeats(decode_once, cfg.timing) if execution.on_device else [decode_once(True)]
    engine, runner, batch = runs[-1]
    tokens = [o.generated for o in batch.outputs]
    if reference is None:  # this gpu_only run is the reference
        reference = tokens
        store_reference(cfg.cache_dir, ref_key, tokens, model_identity(cfg))
    check = compare_tokens(reference, tokens)
    if trace is not None:
        describe_batch(trace, batch)
        trace.save(run_dir / "trace.npz")
        calibration.save(run_dir / "calibration.npz")

    counts = {"prompts": len(prompts), "generated_tokens": batch.generated_tokens,
              "requested_tokens": batch.requested_tokens, "denoise_steps": batch.denoise_steps,
              "routed_tokens": batch.routed_tokens}
    if batch.decode_steps:  # an autoregressive family
        counts["decode_steps"] = batch.decode_steps
    clock = {"wall_s": batch.wall_s, "load_s": load_s,
             "wall_tokens_per_s": batch.generated_tokens / batch.wall_s if batch.wall_s > 0 else 0.0}
    result = build_result(cfg, setup, engine, counts, clock, RunIdentity(
        source="live", weights=loaded.weights, checkpoint=str(loaded.path), backend=execution.backend),
        routing if setup.measures else None)
    result.lossless = check.metrics()
    result.workload = workload_record(cfg.workload, prompts)  # MLflow's dataset input
    if trace is not None:  # how realistic this run's routing is, beside uniform routing
        result.routing = statistics_with_uniform(trace, max(1, int(setup.budget.experts_per_layer)))
    execution.add_measured(result, runner)  # on a device: timing=measured, the modeled figures beside it
    if execution.on_device:
        add_repeat_figures(result, [r.summary()["measured_time_s"] for _, r, _ in runs], cfg.timing)
    first = batch.outputs[0]
    result.decoded = DecodedOutputs(
        outputs=[{"prompt_tokens": len(o.prompt_ids), "tokens": o.generated, "n_generated": o.n_generated,
                  "stopped_at_eos": o.stopped_at_eos} for o in batch.outputs],
        steps=[asdict(r) for o in batch.outputs for r in o.records],
        first_text=loaded.tokenizer.decode(first.generated[: first.n_generated]),
    )
    return result  # run_job writes result.json


