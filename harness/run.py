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
from harness.budget import resolve_budget
from harness.config import validate
from harness.cost import CostModel, HardwareConfig, load_hardware
from harness.decoding import DecodeOutput, DecodeSettings, OnForward, StepInfo, decode
from harness.engine import OffloadEngine
from harness.errors import HarnessError
from harness.lossless import compare_tokens, load_reference, store_reference
from harness.model import KVCache, LoadedModel, load_model
from harness.results import fingerprint, write_json_atomic
from harness.trace import RoutingTrace
from harness.workload import encode_prompt, load_prompts
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


def decode_with_engine(loaded: LoadedModel, engine: OffloadEngine, prompts: list[str], settings: DecodeSettings,
                       desc: str) -> DecodeBatch:
    hook = EngineHook(engine)
    previous = loaded.model.engine
    loaded.model.engine = engine
    try:
        return decode_prompts(loaded, prompts, settings, on_forward=hook, desc=desc)
    finally:
        hook.close()
        loaded.model.engine = previous


def model_identity(cfg: DictConfig, loaded: LoadedModel) -> dict[str, Any]:
    """What determines the routing and the tokens, besides prompts and decode settings."""
    return {"model": cfg.model.name, "weights": loaded.weights, "checkpoint": str(loaded.path.resolve()),
            "dtype": cfg.model.dtype}


def calibration_trace(cfg: DictConfig, loaded: LoadedModel, settings: DecodeSettings) -> RoutingTrace:
    """gpu_only routing of the calibration prompts, recorded once per model and settings."""
    prompts = [str(p) for p in cfg.calibration.prompts]
    if not prompts:
        raise HarnessError(f"system={cfg.system.name} learns from a calibration trace but calibration.prompts is empty")
    key = fingerprint({**model_identity(cfg, loaded), "decode": asdict(settings), "prompts": prompts})
    path = Path(cfg.cache_dir) / "calibration" / f"{key}.npz"
    if path.exists():
        try:
            return RoutingTrace.load(path)
        except HarnessError:
            pass  # a damaged cache entry is re-recorded
    geometry = loaded.nominal
    trace = RoutingTrace(geometry.n_moe_layers, geometry.num_experts, geometry=geometry.to_dict(),
                         meta={"purpose": "calibration", **model_identity(cfg, loaded), "decode": asdict(settings)})
    engine = OffloadEngine(make_system("gpu_only", {}), geometry, geometry.num_experts,
                           CostModel(geometry, HardwareConfig()), trace=trace)
    engine.prepare(None)
    decode_with_engine(loaded, engine, prompts, settings, desc="calibration")
    trace.save(path)
    return trace


def reference_tokens(cfg: DictConfig, loaded: LoadedModel, prompts: list[str], settings: DecodeSettings
                     ) -> tuple[str, list[list[int]] | None]:
    key = fingerprint({**model_identity(cfg, loaded), "decode": asdict(settings), "prompts": prompts})
    return key, load_reference(cfg.cache_dir, key)


def system_options(cfg: DictConfig) -> dict[str, Any]:
    options = OmegaConf.to_container(cfg.system, resolve=True)
    options.pop("name", None)
    return options


def run_job(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Run one configuration end to end and write `result.json` into `run_dir`."""
    validate(cfg)
    prompts = load_prompts(cfg.workload, cfg.limit_prompts)
    settings = decode_settings(cfg)
    system = make_system(cfg.system.name, system_options(cfg))
    t0 = time.perf_counter()
    loaded = load_model(cfg.model, cfg.cache_dir)
    load_s = time.perf_counter() - t0
    geometry = loaded.nominal
    budget = resolve_budget(cfg.budget, geometry)
    hardware = load_hardware(cfg.hardware, geometry)
    cost = CostModel(geometry, hardware)

    calibration = calibration_trace(cfg, loaded, settings) if system.needs_calibration else None
    ref_key, reference = reference_tokens(cfg, loaded, prompts, settings)
    if reference is None and system.name != "gpu_only":
        reference = [o.generated for o in decode_prompts(loaded, prompts, settings, desc="reference").outputs]
        store_reference(cfg.cache_dir, ref_key, reference, model_identity(cfg, loaded))

    engine = OffloadEngine(system, geometry, budget.experts_per_layer, cost)
    engine.prepare(calibration)
    batch = decode_with_engine(loaded, engine, prompts, settings, desc=system.name)
    tokens = [o.generated for o in batch.outputs]
    if reference is None:  # this gpu_only run is the reference
        reference = tokens
        store_reference(cfg.cache_dir, ref_key, tokens, model_identity(cfg, loaded))
    check = compare_tokens(reference, tokens)

    summary = engine.summary()
    step_series = summary.pop("step_series")
    report = system.report()
    modeled_s = summary["modeled_time_s"]
    metrics: dict[str, Any] = {
        "tokens_per_s": batch.generated_tokens / modeled_s if modeled_s > 0 else 0.0,
        "wall_tokens_per_s": batch.generated_tokens / batch.wall_s if batch.wall_s > 0 else 0.0,
        "experts_per_layer": budget.experts_per_layer,
        "experts_per_layer_derived": budget.derived_experts_per_layer,
        "budget_gb": budget.gpu_gb,
        **{k: v for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)},
        **check.metrics(),
        "prompts": len(prompts),
        "generated_tokens": batch.generated_tokens,
        "denoise_steps": batch.denoise_steps,
        "forwards": batch.forwards,
        "routed_tokens": batch.routed_tokens,
        "wall_s": batch.wall_s,
        "load_s": load_s,
    }
    for key, value in report.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics[key] = value
    tok = loaded.tokenizer
    first = batch.outputs[0]
    result = {
        "schema": 1,
        "system": system.name,
        "model": cfg.model.name,
        "weights": loaded.weights,
        "checkpoint": str(loaded.path),
        "timing": "modeled",
        "hardware": hardware.name,
        "decode_cache": settings.cache,
        "budget": budget.as_dict(),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "metrics": metrics,
        "step_series": step_series,
        "system_report": report,
        "outputs": [{"prompt_tokens": len(o.prompt_ids), "tokens": o.generated, "n_generated": o.n_generated,
                     "stopped_at_eos": o.stopped_at_eos} for o in batch.outputs],
        "steps": [asdict(r) for o in batch.outputs for r in o.records],
        "first_text": tok.decode(first.generated[: first.n_generated]),
        "versions": versions(),
    }
    write_json_atomic(Path(run_dir) / "result.json", result)
    return result


def versions() -> dict[str, str]:
    import hydra
    import transformers

    return {
        "harness": harness.__version__, "python": platform.python_version(), "torch": torch.__version__,
        "hydra": hydra.__version__, "transformers": transformers.__version__, "machine": platform.node(),
    }


def summary_lines(result: dict[str, Any], show_text: bool = True) -> list[str]:
    m, b = result["metrics"], result["budget"]
    tau = f" tau*={m['tau_star']:g}" if "tau_star" in m else ""
    lines = [
        f"[{result['system']}] model={result['model']} ({result['weights']} weights) budget={b['name']} "
        f"B={b['experts_per_layer']} cache={result['decode_cache']} hardware={result['hardware']}: "
        f"{m['prompts']} prompts, {m['generated_tokens']} tokens, {m['denoise_steps']} denoising steps | "
        f"modeled {m['tokens_per_s']:.1f} tokens/s, wall {m['wall_tokens_per_s']:.1f} tokens/s | "
        f"miss {100 * m['miss_rate']:.1f}%, io {m['io_gb']:.2f} GB, cpu expert tokens {m['cpu_expert_tokens']}"
        f"{tau} | lossless={m['lossless']} (match {100 * m['token_match_rate']:.1f}%)"
    ]
    if show_text:
        lines.append(f"first prompt's output: {result['first_text'][:300]!r}")
    return lines
