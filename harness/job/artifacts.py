"""Cached artifacts every run shares, keyed by what determines them.

- the calibration trace: gpu_only routing of the calibration prompts (systems learn from it)
- the reference tokens: gpu_only output of the workload (the lossless check compares to it)
- the workload trace: gpu_only routing of the workload with next-layer hints (replay runs
  every system over it)

With `decode.cache=none` both traces are derived from the prefix-cached recording
(`trace.derive_no_cache`): the same routing at a fraction of the cost, since a no-cache
decode recomputes the whole window every step. The derived trace is cached under the
no-cache key, the prefix trace under its own.

All three depend only on the model, its weights, the prompts and the decode settings, not
on the system: on one device every system produces the gpu_only tokens bit for bit, so it
also routes exactly like gpu_only. The model is loaded only when something must be
computed; a cache hit costs a file read.

They also depend on the code that computes them: a change in how the model or the
decoding loop rounds (a different kernel, another summation order) changes tokens, and a
reference from the old code would then fail every lossless check of the new one. So the
key holds a fingerprint of that code (`NUMERICS_SOURCES`) and of the torch version, and
for real weights the size and modification time of the checkpoint's files: after any of
them changes, the artifacts are computed again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import systems
from harness.accounting.cost import CostModel, HardwareConfig
from harness.common.errors import HarnessError
from harness.common.files import fingerprint
from harness.common.machine import machine_environment
from harness.decode.decode_batch import DecodeBatch, decode_with_engine
from harness.decode.decoding import DecodeSettings, steps_per_block
from harness.decode.lossless import load_reference, store_reference
from harness.decode.workload import load_prompts
from harness.job.hybrid_setup import all_gpu_engine, reference_key
from harness.placement.trace import RoutingTrace, derive_no_cache
from harness.traces.repetition import GENERATED_IDS
from harness.traces.serving import PER_PROMPT_TOKENS
from harness.training.proxy_cache import weights_at

if TYPE_CHECKING:
    from harness.decode.loading import LoadedModel
    from harness.job.config import HarnessConfig

ModelLoader = Callable[[], "LoadedModel"]
Stale = Callable[[RoutingTrace], bool]


# the code that decides tokens and routing, relative to harness/ (see the module docstring)
NUMERICS_SOURCES = ("model/llada2.py", "model/experts.py", "model/hints.py", "model/checkpoint.py",
                    "model/config.py",
                    "model/proxy.py", "decode/decoding.py", "decode/workload.py", "training/proxy_cache.py",
                    # the transformers families: the bridge, their proxies and decode loops
                    "families/bridge.py", "families/adapter.py", "families/proxies.py", "families/loading.py",
                    # the entries: how each kind loads, decodes and joins the engine
                    "zoo/llada2.py", "zoo/families.py", "zoo/ar_generate.py", "zoo/diffusiongemma_generate.py")


def code_fingerprint(root: Path, sources: tuple[str, ...]) -> str:
    """A digest of the torch and transformers versions and the source files (names and
    bytes) under root (the families compute with transformers' own modeling code)."""
    digest = hashlib.sha256(f"{torch.__version__} {metadata.version('transformers')}".encode())
    for rel in sources:
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def numerics_fingerprint() -> str:
    return code_fingerprint(Path(__file__).resolve().parent.parent, NUMERICS_SOURCES)


@lru_cache(maxsize=1)
def code_version() -> str:
    """A digest of every source file of the harness and the systems: which code produced a
    result (recorded in result.json; resume=true reuses only results of the same code)."""

    roots = [Path(__file__).resolve().parent.parent, Path(systems.__file__).resolve().parent]
    base = roots[0].parent
    sources = tuple(sorted(str(f.relative_to(base)) for root in roots for f in root.rglob("*.py")))
    return code_fingerprint(base, sources)


def checkpoint_files(path: Path) -> str:
    """Size and modification time of a real checkpoint's weights and configs: a checkpoint
    replaced at the same path gets new artifacts."""
    stats = sorted(_size_and_time(p) for p in path.glob("*") if p.suffix in (".safetensors", ".json"))
    return fingerprint({"files": stats})


def _size_and_time(path: Path) -> tuple[str, int, int]:
    try:
        st = path.stat()
    except OSError:  # a broken link: the loader refuses it by name; the key just has to differ
        return path.name, -1, -1
    return path.name, st.st_size, st.st_mtime_ns


def model_identity(cfg: HarnessConfig) -> dict[str, Any]:
    """What determines routing and tokens besides the prompts and decode settings."""
    identity: dict[str, Any] = {"model": cfg.model.name, "dtype": cfg.model.dtype, "numerics": numerics_fingerprint(),
                                "expert_sum_order": cfg.model.expert_sum_order}
    proxy_identity = cfg.model.entry.proxy_identity
    if cfg.model.path is not None:
        checkpoint = Path(cfg.model.path).resolve()
        identity.update(weights=weights_at(checkpoint), checkpoint=str(checkpoint),
                        checkpoint_files=checkpoint_files(checkpoint))
    elif proxy_identity is not None:  # a proxy: rebuilt from what its entry names by the code above
        identity.update(proxy_identity(cfg.model, Path(cfg.cache_dir)))
    return identity


def artifact_key(cfg: HarnessConfig, settings: DecodeSettings, prompts: list[str]) -> str:
    return fingerprint({**model_identity(cfg), "decode": asdict(settings), "prompts": prompts})


def new_trace(loaded: LoadedModel, cfg: HarnessConfig, settings: DecodeSettings, purpose: str) -> RoutingTrace:
    g = loaded.nominal
    # where it was recorded: a bf16 decode can take other tokens on other CPU kernels
    recorded_on = {k: v for k, v in machine_environment().items() if k in ("cpu_model", "cpu_kernels", "gpu")}
    meta = {"purpose": purpose, **model_identity(cfg), "decode": asdict(settings),
            "recorded_on": {**recorded_on, "torch": torch.__version__}}
    return RoutingTrace(g.n_moe_layers, g.num_experts, geometry=g.to_dict(), meta=meta)


def record_trace(loaded: LoadedModel, cfg: HarnessConfig, prompts: list[str], settings: DecodeSettings,
                 purpose: str) -> tuple[RoutingTrace, DecodeBatch]:
    """Decode with every expert in place and record the routing (with hints)."""

    g = loaded.nominal
    trace = new_trace(loaded, cfg, settings, purpose)
    engine = all_gpu_engine(loaded, CostModel(g, HardwareConfig()), steps_per_block(settings), trace=trace)
    batch = decode_with_engine(loaded, engine, prompts, settings, desc=purpose)
    describe_batch(trace, batch)
    return trace, batch


def describe_batch(trace: RoutingTrace, batch: DecodeBatch) -> None:
    """What replay needs to turn modeled seconds into tokens/s."""
    trace.meta.update(prompts=len(batch.outputs), generated_tokens=batch.generated_tokens,
                      denoise_steps=batch.denoise_steps, requested_tokens=batch.requested_tokens)
    # each request's own count, for lock-step serving's time per output token (harness/traces/serving.py)
    trace.meta[PER_PROMPT_TOKENS] = [o.n_generated for o in batch.outputs]
    # and its ids, for the greedy-loop statistic (harness/traces/repetition.py)
    trace.meta[GENERATED_IDS] = [[int(t) for t in o.generated[: o.n_generated]] for o in batch.outputs]
    if batch.decode_steps:  # an autoregressive family
        trace.meta["decode_steps"] = batch.decode_steps


def cached_trace(path: Path, stale: Stale | None = None) -> RoutingTrace | None:
    if not path.exists():
        return None
    try:
        trace = RoutingTrace.load(path)
    except HarnessError:
        return None  # a damaged cache entry is recorded again, never trusted
    return None if stale is not None and stale(trace) else trace


def calibration_prompts(cfg: HarnessConfig) -> list[str]:
    """calibration.prompts, or with calibration.from_workload = N the last N prompts of the
    workload's dataset, which the run (its first limit_prompts) never decodes."""
    n = cfg.calibration.from_workload
    if n <= 0:
        return [str(p) for p in cfg.calibration.prompts]
    every = load_prompts(cfg.workload)
    decoded = min(cfg.limit_prompts or len(every), len(every))
    if n > len(every) - decoded:
        raise HarnessError(f"calibration.from_workload={n} needs {n} prompts the run does not decode, but workload "
                           f"{cfg.workload.name} has {len(every)} and the run decodes {decoded}: lower "
                           "calibration.from_workload or limit_prompts")
    return every[-n:]


def calibration_path(cfg: HarnessConfig, settings: DecodeSettings, backend: str = "cpu") -> Path:
    """Where the cached calibration trace of this config lives (recorded or not)."""
    prompts = calibration_prompts(cfg)
    if not prompts:
        raise HarnessError(f"system={cfg.system.name} learns from a calibration trace but calibration.prompts "
                           "is empty; list prompts under calibration.prompts")
    key = artifact_key(cfg, settings, prompts)
    key = reference_key(key, backend)  # the cpu backend's key is the artifact key itself
    return Path(cfg.cache_dir) / "calibration" / f"{key}.npz"


def calibration_trace(cfg: HarnessConfig, settings: DecodeSettings, load: ModelLoader,
                      backend: str = "cpu") -> RoutingTrace:
    """The calibration routing, cached per backend: a device decodes in its own dtype with
    its own kernels, so it routes (a little) differently from the host emulation."""
    path = calibration_path(cfg, settings, backend)
    trace = cached_trace(path)
    if trace is None:
        if settings.cache == "none":
            trace = derive_no_cache(calibration_trace(cfg, replace(settings, cache="prefix"), load, backend))
        else:
            trace, _ = record_trace(load(), cfg, calibration_prompts(cfg), settings, "calibration")
        trace.save(path)
    return trace


def workload_trace(cfg: HarnessConfig, prompts: list[str], settings: DecodeSettings, load: ModelLoader,
                   stale: Stale | None = None) -> tuple[RoutingTrace, Path]:
    """The gpu_only routing of the workload, recorded live on first use; its tokens are
    stored as the reference too, since they are the same decode. A no-cache trace is
    derived from the prefix-cached one (whose tokens are not stored as the no-cache
    reference: a live no-cache run computes its own). A cached trace that `stale` calls
    out of date (recorded before the meta the caller needs existed) is recorded again."""
    key = artifact_key(cfg, settings, prompts)
    path = Path(cfg.cache_dir) / "traces" / f"{key}.npz"
    trace = cached_trace(path, stale)
    if trace is None and settings.cache == "none":
        prefix, prefix_path = workload_trace(cfg, prompts, replace(settings, cache="prefix"), load, stale)
        trace = derive_no_cache(prefix)
        trace.meta["derived_from_trace"] = str(prefix_path)
        trace.save(path)
    if trace is None:
        trace, batch = record_trace(load(), cfg, prompts, settings, "workload")
        trace.save(path)
        if load_reference(cfg.cache_dir, key, settings.reference_shape(len(prompts))) is None:
            store_reference(cfg.cache_dir, key, [o.generated for o in batch.outputs], model_identity(cfg))
    return trace, path


def reference_tokens(cfg: HarnessConfig, settings: DecodeSettings, prompts: list[str]) -> tuple[str, list | None]:
    key = artifact_key(cfg, settings, prompts)
    return key, load_reference(cfg.cache_dir, key, settings.reference_shape(len(prompts)))
