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
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import harness
from harness.artifacts import calibration_trace, describe_batch, model_identity, new_trace, reference_tokens
from harness.budget import Budget, resolve_budget
from harness.config import validate
from harness.cost import CostModel, HardwareConfig, load_hardware
from harness.decoding import DecodeOutput, DecodeSettings, OnForward, StepInfo, decode
from harness.engine import OffloadEngine
from harness.hybrid.backend import DEVICE_BACKENDS, resolve_backend
from harness.hybrid.executor import HybridExecutor, apply_measured
from harness.hybrid.placement import wrap
from harness.hybrid.wiring import all_gpu_engine, load_on_device, reference_key
from harness.lossless import compare_tokens, load_reference, store_reference
from harness.model import KVCache, LLaDA2Config, LoadedModel, load_model, nominal_geometry
from harness.results import write_json_atomic
from harness.topology import SINGLE, Topology, build_topology
from harness.trace import RoutingTrace
from harness.workload import encode_prompt, load_prompts
from systems.base import System
from systems.registry import make_system


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


def decode_settings(cfg: DictConfig) -> DecodeSettings:
    return DecodeSettings(**OmegaConf.to_container(cfg.decode, resolve=True))


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

    start = time.perf_counter()
    for i, text in enumerate(prompts):
        ids = encode_prompt(loaded.tokenizer, text)
        out = decode(
            loaded.model, ids, settings, cfg.mask_token_id, cfg.eos_token_id,
            new_cache=KVCache, on_forward=hook, prompt_index=i, first_global_step=global_step,
        )
        global_step += len(out.records)
        outputs.append(out)
        bar.update(1)
    bar.close()
    return DecodeBatch(outputs, time.perf_counter() - start)


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


def system_options(cfg: DictConfig) -> dict[str, Any]:
    options = OmegaConf.to_container(cfg.system, resolve=True)
    options.pop("name", None)
    return options


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


def build_cost_model(cfg: DictConfig, geometry: LLaDA2Config, hardware: HardwareConfig) -> CostModel:
    return CostModel(geometry, hardware)


def setup_run(cfg: DictConfig, geometry: LLaDA2Config) -> RunSetup:
    system = make_system(cfg.system.name, system_options(cfg))
    budget = resolve_budget(cfg.budget, geometry)
    hardware = load_hardware(cfg.hardware, geometry)
    return RunSetup(system, geometry, budget, hardware, build_cost_model(cfg, geometry, hardware),
                    build_topology(cfg.get("topology")))


def run_job(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Run one configuration and write `result.json` into `run_dir`: live by default,
    over a recorded routing trace with `source=trace`."""
    validate(cfg)
    if cfg.source == "trace":
        from harness.replay import run_replay

        return run_replay(cfg, run_dir)
    return run_live(cfg, run_dir)


def run_live(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    prompts = load_prompts(cfg.workload, cfg.limit_prompts)
    settings = decode_settings(cfg)
    setup = setup_run(cfg, nominal_geometry(cfg.model))
    backend = resolve_backend(cfg.get("backend", "auto"))
    t0 = time.perf_counter()
    on_device = backend in DEVICE_BACKENDS
    loaded = load_on_device(cfg, backend) if on_device else load_model(cfg.model, cfg.cache_dir)
    load_s = time.perf_counter() - t0

    def model() -> LoadedModel:
        return loaded

    record = bool(cfg.trace.record)
    calibration = None
    if setup.system.needs_calibration or record:
        calibration = calibration_trace(cfg, settings, model, backend)
    ref_key, reference = reference_tokens(cfg, settings, prompts)
    if on_device:  # the reference is computed by this GPU's kernels: CPU kernels round differently
        ref_key = reference_key(ref_key, backend)
        reference = load_reference(cfg.cache_dir, ref_key)
    if reference is None and setup.system.name != "gpu_only":
        if on_device:
            ref_batch = decode_with_engine(loaded, all_gpu_engine(loaded, setup.cost, settings.steps), prompts,
                                           settings, desc="reference")
        else:
            ref_batch = decode_prompts(loaded, prompts, settings, desc="reference")
        reference = [o.generated for o in ref_batch.outputs]
        store_reference(cfg.cache_dir, ref_key, reference, model_identity(cfg))

    trace = new_trace(loaded, cfg, settings, "workload") if record else None
    engine = setup.engine(trace)
    engine.prepare(calibration if setup.system.needs_calibration else None, settings.steps)
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

    counts = {
        "prompts": len(prompts), "generated_tokens": batch.generated_tokens, "denoise_steps": batch.denoise_steps,
        "routed_tokens": batch.routed_tokens, "wall_s": batch.wall_s, "load_s": load_s,
        "wall_tokens_per_s": batch.generated_tokens / batch.wall_s if batch.wall_s > 0 else 0.0,
        **check.metrics(),
    }
    first = batch.outputs[0]
    result = build_result(cfg, setup, engine, counts, source="live", weights=loaded.weights,
                          checkpoint=str(loaded.path))
    result["backend"] = backend
    if trace is not None:  # how realistic this run's routing is, beside uniform routing
        add_routing_statistics(result, trace, setup.budget.experts_per_layer)
    if isinstance(runner, HybridExecutor):  # timing=measured; the modeled figures stay beside it
        apply_measured(result, runner.summary(), backend)
    result.update(
        outputs=[{"prompt_tokens": len(o.prompt_ids), "tokens": o.generated, "n_generated": o.n_generated,
                  "stopped_at_eos": o.stopped_at_eos} for o in batch.outputs],
        steps=[asdict(r) for o in batch.outputs for r in o.records],
        first_text=loaded.tokenizer.decode(first.generated[: first.n_generated]),
    )
    write_json_atomic(run_dir / "result.json", result)
    return result


def build_result(cfg: DictConfig, setup: RunSetup, engine: OffloadEngine, counts: dict[str, Any], source: str,
                 weights: str, checkpoint: str) -> dict[str, Any]:
    """The result record shared by live and replay runs (result.json's keys)."""
    summary = engine.summary()
    step_series = summary.pop("step_series")
    report = setup.system.report()
    modeled_s = summary["modeled_time_s"]
    metrics: dict[str, Any] = {
        "tokens_per_s": counts["generated_tokens"] / modeled_s if modeled_s > 0 else 0.0,
        "experts_per_layer": setup.budget.experts_per_layer,
        "experts_per_layer_derived": setup.budget.derived_experts_per_layer,
        "budget_gb": setup.budget.gpu_gb,
        **{k: v for k, v in summary.items() if _is_number(v)},
        **counts,
    }
    metrics.update({k: v for k, v in report.items() if _is_number(v)})
    return {
        "schema": 1,
        "system": setup.system.name,
        "model": cfg.model.name,
        "weights": weights,
        "checkpoint": checkpoint,
        "source": source,
        "timing": "modeled",
        "hardware": setup.hardware.name,
        "decode_cache": cfg.decode.cache,
        "budget": setup.budget.as_dict(),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "metrics": metrics,
        "step_series": step_series,
        "system_report": report,
        "versions": versions(),
    }


def add_routing_statistics(result: dict[str, Any], trace: RoutingTrace, experts_per_layer: int) -> None:
    """result['routing'] (harness/routing_stats.py) and its flat routing_* metrics."""
    from harness.routing_stats import routing_metrics, statistics_with_uniform

    result["routing"] = statistics_with_uniform(trace, max(1, int(experts_per_layer)))
    result["metrics"].update(routing_metrics(result["routing"]))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def versions() -> dict[str, str]:
    import hydra
    import transformers

    from harness.artifacts import code_version

    return {
        "harness": harness.__version__, "code": code_version(), "python": platform.python_version(),
        "torch": torch.__version__,
        "hydra": hydra.__version__, "transformers": transformers.__version__, "machine": platform.node(),
    }


def summary_lines(result: dict[str, Any], show_text: bool = True) -> list[str]:
    m, b = result["metrics"], result["budget"]
    tau = f" tau*={m['tau_star']:g}" if "tau_star" in m else ""
    lossless = (f"lossless={m['lossless']} (match {100 * m['token_match_rate']:.1f}%)" if "lossless" in m
                else "lossless=n/a (replay: no numerics)")
    speed = f"{result['timing']} {m['tokens_per_s']:.1f} tokens/s"
    if m.get("measured_time_s"):  # how much of the measured time was the planner's and harness's Python
        share = (m["measured_host_plan_s"] + m["measured_host_engine_s"]) / m["measured_time_s"]
        speed += f" ({100 * share:.0f}% host planning)"
    if "modeled_tokens_per_s" in m:  # a measured run also reports the model's prediction
        speed += f", modeled {m['modeled_tokens_per_s']:.1f}"
    speed += f", wall {m['wall_tokens_per_s']:.1f}" if "wall_tokens_per_s" in m else f" ({result['source']})"
    lines = [
        f"[{result['system']}] model={result['model']} ({result['weights']} weights) budget={b['name']} "
        f"B={b['experts_per_layer']} cache={result['decode_cache']} hardware={result['hardware']}: "
        f"{m['prompts']} prompts, {m['generated_tokens']} tokens, {m['denoise_steps']} denoising steps | {speed} | "
        f"miss {100 * m['miss_rate']:.1f}%, io {m['io_gb']:.2f} GB, cpu expert tokens {m['cpu_expert_tokens']}"
        f"{tau} | {lossless}"
    ]
    if show_text and "first_text" in result:
        lines.append(f"first prompt's output: {result['first_text'][:300]!r}")
    return lines
