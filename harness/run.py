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

import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import harness
from harness.artifacts import calibration_trace, describe_batch, model_identity, new_trace, reference_tokens
from harness.budget import Budget, resolve_budget
from harness.config import HarnessConfig
from harness.cost import CostModel, HardwareConfig
from harness.decoding import DecodeOutput, DecodeSettings, OnForward, StepInfo, decode, steps_per_block
from harness.engine import OffloadEngine
from harness.hybrid.backend import DEVICE_BACKENDS, resolve_backend
from harness.hybrid.executor import HybridExecutor, apply_measured, wrap
from harness.hybrid.wiring import all_gpu_engine, load_on_device, reference_key
from harness.lossless import compare_tokens, load_reference, store_reference
from harness.model import KVCache, LLaDA2Config, LoadedModel, load_model, nominal_geometry
from harness.profiling import load_hardware
from harness.result import DecodedOutputs, DuplicateMetricError, RunIdentity, RunResult, Timing, is_number
from harness.routing_stats import statistics_with_uniform
from harness.topology import SINGLE, Topology, build_topology
from harness.trace import RoutingTrace
from harness.workload import check_prompt_lengths, encode_prompt, load_prompts, workload_record
from systems.base import System
from systems.registry import system_from_config


@dataclass
class DecodeBatch:
    outputs: list[DecodeOutput]
    wall_s: float

    @property
    def generated_tokens(self) -> int:
        return sum(o.n_generated for o in self.outputs)

    @property
    def denoise_steps(self) -> int:
        return sum(1 for o in self.outputs for r in o.records if r.kind == "denoise")

    @property
    def forwards(self) -> int:
        return sum(len(o.records) for o in self.outputs)

    @property
    def routed_tokens(self) -> int:
        return sum(r.tokens_routed for o in self.outputs for r in o.records)


def decode_prompts(
    loaded: LoadedModel,
    prompts: list[str],
    settings: DecodeSettings,
    on_forward: OnForward | None = None,
    desc: str = "decode",
) -> DecodeBatch:
    """Decode prompts one at a time (batch 1, as in the offloading papers)."""
    cfg = loaded.model.config
    outputs: list[DecodeOutput] = []
    global_step = 0
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", mininterval=0.5, leave=False, dynamic_ncols=True)

    def hook(step: StepInfo, n_tokens: int, n_context: int) -> None:
        if step.kind == "denoise" and step.step == 0:
            bar.set_postfix_str(f"block {step.block}", refresh=False)
        if on_forward is not None:
            on_forward(step, n_tokens, n_context)

    encoded = encode_checked(loaded, prompts, settings, desc)
    start = time.perf_counter()
    for i, ids in enumerate(encoded):
        out = decode(
            loaded.model, ids, settings, cfg.mask_token_id, cfg.eos_token_id,
            new_cache=KVCache, on_forward=hook, prompt_index=i, first_global_step=global_step,
        )
        global_step += len(out.records)
        outputs.append(out)
        bar.update(1)
    bar.close()
    return DecodeBatch(outputs, time.perf_counter() - start)


def encode_checked(loaded: LoadedModel, prompts: list[str], settings: DecodeSettings, what: str) -> list[list[int]]:
    """Token ids of every prompt, each checked to fit the model's positions before any decoding."""
    encoded = [encode_prompt(loaded.tokenizer, text) for text in prompts]
    check_prompt_lengths(encoded, settings.gen_length, settings.block_length,
                         loaded.model.config.max_position_embeddings, what)
    return encoded


class EngineHook:
    """Connects the decoding loop's per-forward hook to the engine."""

    def __init__(self, engine: OffloadEngine) -> None:
        self.engine = engine

    def __call__(self, step: StepInfo, n_tokens: int, n_context: int) -> None:
        self.engine.begin_step(step, n_tokens, n_context)  # also closes the previous step

    def close(self) -> None:
        self.engine.end_step()


def decode_with_engine(loaded: LoadedModel, engine: OffloadEngine | HybridExecutor, prompts: list[str],
                       settings: DecodeSettings, desc: str) -> DecodeBatch:
    runner = wrap(loaded.model, engine)  # a HybridExecutor when the model is on a device (backend=cuda|standin)
    hook = EngineHook(runner)
    previous = loaded.model.engine
    loaded.model.engine = runner
    try:
        return decode_prompts(loaded, prompts, settings, on_forward=hook, desc=desc)
    finally:
        hook.close()
        loaded.model.engine = previous
        if runner is not engine:  # made here (calibration, reference): free its device slots
            runner.close()


@dataclass
class RunSetup:
    """What a run charges and decides with: the same for live and replay runs."""

    system: System
    geometry: LLaDA2Config
    budget: Budget
    hardware: HardwareConfig
    cost: CostModel
    topology: Topology = SINGLE

    def engine(self, trace: RoutingTrace | None = None) -> OffloadEngine:
        return OffloadEngine(self.system, self.geometry, self.budget.experts_per_layer, self.cost, trace=trace,
                             topology=self.topology)


def setup_run(cfg: HarnessConfig, geometry: LLaDA2Config) -> RunSetup:
    system = system_from_config(cfg.system)
    budget = resolve_budget(cfg.budget, geometry)
    hardware = load_hardware(cfg.hardware, geometry)
    return RunSetup(system, geometry, budget, hardware, CostModel(geometry, hardware), build_topology(cfg.topology))


def run_job(cfg: HarnessConfig, run_dir: str | Path) -> RunResult:
    """Run one configuration and write `result.json` into `run_dir`: live by default,
    over a recorded routing trace with `source=trace`. `cfg` was checked when it was built."""
    if cfg.source == "trace":
        from harness.replay import run_replay

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
    if setup.system.needs_calibration or record:
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
    engine.prepare(calibration if setup.system.needs_calibration else None, steps_per_block(settings))
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


def build_result(cfg: HarnessConfig, setup: RunSetup, engine: OffloadEngine, counts: dict[str, Any],
                 clock: dict[str, float], identity: RunIdentity) -> RunResult:
    """The result shared by live and replay runs: `identity` says how the run ran (source,
    weights, checkpoint, backend or trace); the rest comes from the config and the engine."""
    summary = engine.summary()
    step_series = summary.pop("step_series")
    modeled_s = summary["modeled_time_s"]
    metrics: dict[str, Any] = {
        "tokens_per_s": counts["generated_tokens"] / modeled_s if modeled_s > 0 else 0.0,
        "experts_per_layer_derived": setup.budget.derived_experts_per_layer,
        "budget_gb": setup.budget.gpu_gb,
        **{k: v for k, v in summary.items() if is_number(v)},  # experts_per_layer: the engine's B (the budget's)
    }
    for key, value in counts.items():
        if key in metrics:
            raise DuplicateMetricError(f"run count {key!r} is also an engine metric; rename one of them")
        metrics[key] = value
    identity.system, identity.model = setup.system.name, cfg.model.name
    identity.hardware, identity.decode_cache = setup.hardware.name, cfg.decode.cache
    result = RunResult(identity=identity, config=cfg.as_dict(), budget=setup.budget.as_dict(), metrics=metrics,
                       system_report=setup.system.report(), timing=Timing("modeled", dict(clock)),
                       versions=versions(), step_series=step_series)
    result.flat_metrics()  # a key reported twice is an error now, before anything is written
    return result


def versions() -> dict[str, str]:
    import hydra
    import transformers

    from harness.artifacts import code_version

    return {
        "harness": harness.__version__, "code": code_version(), "python": platform.python_version(),
        "torch": torch.__version__,
        "hydra": hydra.__version__, "transformers": transformers.__version__, "machine": platform.node(),
    }
