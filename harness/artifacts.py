"""Cached artifacts every run shares, keyed by what determines them.

- the calibration trace: gpu_only routing of the calibration prompts (systems learn from it)
- the reference tokens: gpu_only output of the workload (the lossless check compares to it)
- the workload trace: gpu_only routing of the workload with next-layer hints (replay runs
  every system over it)

All three depend only on the model, its weights, the prompts and the decode settings, not
on the system: on one device every system produces the gpu_only tokens bit for bit, so it
also routes exactly like gpu_only. The model is loaded only when something must be
computed; a cache hit costs a file read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from harness.cost import CostModel, HardwareConfig
from harness.decoding import DecodeSettings
from harness.errors import HarnessError
from harness.lossless import load_reference, store_reference
from harness.model.proxy import proxy_dir
from harness.results import fingerprint
from harness.trace import RoutingTrace

if TYPE_CHECKING:
    from harness.model import LoadedModel
    from harness.run import DecodeBatch

ModelLoader = Callable[[], "LoadedModel"]


def model_identity(cfg: DictConfig) -> dict[str, Any]:
    """What determines routing and tokens besides the prompts and decode settings."""
    if cfg.model.path is not None:
        weights, checkpoint = "real", str(Path(cfg.model.path).resolve())
    else:
        weights = "proxy"
        checkpoint = str(proxy_dir(cfg.model.name, Path(cfg.cache_dir) / "proxies", cfg.model.proxy_seed).resolve())
    return {"model": cfg.model.name, "weights": weights, "checkpoint": checkpoint, "dtype": cfg.model.dtype}


def artifact_key(cfg: DictConfig, settings: DecodeSettings, prompts: list[str]) -> str:
    return fingerprint({**model_identity(cfg), "decode": asdict(settings), "prompts": prompts})


def new_trace(loaded: LoadedModel, cfg: DictConfig, settings: DecodeSettings, purpose: str) -> RoutingTrace:
    g = loaded.nominal
    meta = {"purpose": purpose, **model_identity(cfg), "decode": asdict(settings)}
    return RoutingTrace(g.n_moe_layers, g.num_experts, geometry=g.to_dict(), meta=meta)


def record_trace(loaded: LoadedModel, cfg: DictConfig, prompts: list[str], settings: DecodeSettings,
                 purpose: str) -> tuple[RoutingTrace, DecodeBatch]:
    """Decode with every expert in place and record the routing (with hints)."""
    from harness.hybrid.wiring import all_gpu_engine
    from harness.run import decode_with_engine

    g = loaded.nominal
    trace = new_trace(loaded, cfg, settings, purpose)
    engine = all_gpu_engine(loaded, CostModel(g, HardwareConfig()), settings.steps, trace=trace)
    batch = decode_with_engine(loaded, engine, prompts, settings, desc=purpose)
    describe_batch(trace, batch)
    return trace, batch


def describe_batch(trace: RoutingTrace, batch: DecodeBatch) -> None:
    """What replay needs to turn modeled seconds into tokens/s."""
    trace.meta.update(prompts=len(batch.outputs), generated_tokens=batch.generated_tokens,
                      denoise_steps=batch.denoise_steps)


def _cached_trace(path: Path) -> RoutingTrace | None:
    if not path.exists():
        return None
    try:
        return RoutingTrace.load(path)
    except HarnessError:
        return None  # a damaged cache entry is recorded again, never trusted


def calibration_trace(cfg: DictConfig, settings: DecodeSettings, load: ModelLoader) -> RoutingTrace:
    prompts = [str(p) for p in cfg.calibration.prompts]
    if not prompts:
        raise HarnessError(f"system={cfg.system.name} learns from a calibration trace but calibration.prompts "
                           "is empty; list prompts under calibration.prompts")
    path = Path(cfg.cache_dir) / "calibration" / f"{artifact_key(cfg, settings, prompts)}.npz"
    trace = _cached_trace(path)
    if trace is None:
        trace, _ = record_trace(load(), cfg, prompts, settings, "calibration")
        trace.save(path)
    return trace


def workload_trace(cfg: DictConfig, prompts: list[str], settings: DecodeSettings, load: ModelLoader
                   ) -> tuple[RoutingTrace, Path]:
    """The gpu_only routing of the workload, recorded live on first use; its tokens are
    stored as the reference too, since they are the same decode."""
    key = artifact_key(cfg, settings, prompts)
    path = Path(cfg.cache_dir) / "traces" / f"{key}.npz"
    trace = _cached_trace(path)
    if trace is None:
        trace, batch = record_trace(load(), cfg, prompts, settings, "workload")
        trace.save(path)
        if load_reference(cfg.cache_dir, key) is None:
            store_reference(cfg.cache_dir, key, [o.generated for o in batch.outputs], model_identity(cfg))
    return trace, path


def reference_tokens(cfg: DictConfig, settings: DecodeSettings, prompts: list[str]) -> tuple[str, list | None]:
    key = artifact_key(cfg, settings, prompts)
    return key, load_reference(cfg.cache_dir, key)
