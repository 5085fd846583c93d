"""One run: load the model, decode the workload under a system, write result.json.

Data flow (DESIGN section 3):
  config -> model (real weights at model.path, else a cached proxy)
         -> calibration trace (gpu_only routing of the calibration prompts, cached) if the
            system learns from one -> system.prepare() through the engine
         -> decode every workload prompt with the common loop; each MoE layer asks the
            engine, which asks the system for a plan, checks it and charges the cost model
         -> compare tokens with the cached gpu_only reference (lossless)
         -> result.json in the run directory (atomically) -> summary line
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from harness.cli.config import HarnessConfig
from harness.cli.replay import run_replay
from harness.cli.run_setup import build_result, setup_run
from harness.decode.decode_batch import decode_prompts, decode_with_engine, encode_checked
from harness.decode.decoding import steps_per_block
from harness.decode.loading import LoadedModel, load_model
from harness.decode.lossless import compare_tokens, load_reference, store_reference
from harness.decode.workload import load_prompts, workload_record
from harness.hybrid.backend import DEVICE_BACKENDS, resolve_backend
from harness.hybrid.executor import HybridExecutor, apply_measured, wrap
from harness.hybrid.wiring import all_gpu_engine, load_on_device, reference_key
from harness.model import nominal_geometry
from harness.routing_stats import statistics_with_uniform
from harness.traces.artifacts import calibration_trace, describe_batch, model_identity, new_trace, reference_tokens
from harness.tracking.result import DecodedOutputs, RunIdentity, RunResult


def run_job(cfg: HarnessConfig, run_dir: str | Path) -> RunResult:
    """Run one configuration and write `result.json` into `run_dir`: live by default,
    over a recorded routing trace with `source=trace`. `cfg` was checked when it was built."""
    if cfg.source == "trace":
        return run_replay(cfg, run_dir)
    return run_live(cfg, run_dir)


def run_live(cfg: HarnessConfig, run_dir: str | Path) -> RunResult:
    run_dir = Path(run_dir)
    prompts = load_prompts(cfg.workload, cfg.limit_prompts)
    settings = cfg.decode
    setup = setup_run(cfg, nominal_geometry(cfg.model))
    backend = resolve_backend(cfg.backend)
    t0 = time.perf_counter()
    on_device = backend in DEVICE_BACKENDS
    loaded = load_on_device(cfg, backend) if on_device else load_model(cfg.model, cfg.cache_dir)
    load_s = time.perf_counter() - t0
    encode_checked(loaded, prompts, settings, "workload")  # a prompt too long fails before any decoding

    def model() -> LoadedModel:
        return loaded

    record = cfg.trace.record
    calibration = None
    if setup.needs_calibration or record:
        calibration = calibration_trace(cfg, settings, model, backend)
    ref_key, reference = reference_tokens(cfg, settings, prompts)
    if on_device:  # the reference is computed by this GPU's kernels: CPU kernels round differently
        ref_key = reference_key(ref_key, backend)
        reference = load_reference(cfg.cache_dir, ref_key)
    if reference is None and setup.system.name != "gpu_only":
        if on_device:
            all_gpu = all_gpu_engine(loaded, setup.cost, steps_per_block(settings))
            ref_batch = decode_with_engine(loaded, all_gpu, prompts, settings, desc="reference")
        else:
            ref_batch = decode_prompts(loaded, prompts, settings, desc="reference")
        reference = [o.generated for o in ref_batch.outputs]
        store_reference(cfg.cache_dir, ref_key, reference, model_identity(cfg))

    trace = new_trace(loaded, cfg, settings, "workload") if record else None
    engine = setup.engine(trace)
    engine.prepare(calibration if setup.needs_calibration else None, steps_per_block(settings))
    runner = wrap(loaded.model, engine)  # kept here: its measured figures go into the result
    batch = decode_with_engine(loaded, runner, prompts, settings, desc=setup.system.name)
    if isinstance(runner, HybridExecutor):
        runner.close()
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
              "denoise_steps": batch.denoise_steps, "routed_tokens": batch.routed_tokens}
    clock = {"wall_s": batch.wall_s, "load_s": load_s,
             "wall_tokens_per_s": batch.generated_tokens / batch.wall_s if batch.wall_s > 0 else 0.0}
    result = build_result(cfg, setup, engine, counts, clock, RunIdentity(
        source="live", weights=loaded.weights, checkpoint=str(loaded.path), backend=backend))
    result.lossless = check.metrics()
    result.workload = workload_record(cfg.workload, prompts)  # MLflow's dataset input
    if trace is not None:  # how realistic this run's routing is, beside uniform routing
        result.routing = statistics_with_uniform(trace, max(1, int(setup.budget.experts_per_layer)))
    if isinstance(runner, HybridExecutor):  # timing=measured; the modeled figures stay beside it
        apply_measured(result, runner.summary(), backend)
    first = batch.outputs[0]
    result.decoded = DecodedOutputs(
        outputs=[{"prompt_tokens": len(o.prompt_ids), "tokens": o.generated, "n_generated": o.n_generated,
                  "stopped_at_eos": o.stopped_at_eos} for o in batch.outputs],
        steps=[asdict(r) for o in batch.outputs for r in o.records],
        first_text=loaded.tokenizer.decode(first.generated[: first.n_generated]),
    )
    result.save_json(run_dir / "result.json")
    return result


