"""What a live run (harness/run.py) needs from the hybrid backend, in one place."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from harness.cost import CostModel
from harness.engine import OffloadEngine
from harness.hybrid.placement import attach
from harness.hybrid.runtime import CudaRuntime
from harness.model import LoadedModel, load_model
from harness.results import fingerprint
from systems.registry import make_system


def load_on_cuda(cfg: DictConfig) -> LoadedModel:
    """The model of `cfg.model`, attached to the GPU. The weights are loaded in bf16, the
    dtype they run in there: a bf16 checkpoint then stays a zero-copy memory map instead
    of being widened to fp32 on the host first."""
    model_cfg = OmegaConf.merge(cfg.model, {"dtype": "bfloat16"})
    loaded = load_model(model_cfg, cfg.cache_dir)
    attach(loaded.model, CudaRuntime())
    return loaded


def reference_key(key: str, backend: str) -> str:
    """The cached reference tokens of a backend. CUDA references are per GPU model and torch
    build, since kernels (and so roundings) differ between them."""
    if backend != "cuda":
        return key
    device = torch.cuda.get_device_name()
    return fingerprint({"reference": key, "backend": "cuda", "device": device, "torch": torch.__version__})


def reference_engine(loaded: LoadedModel, cost: CostModel, steps: int) -> OffloadEngine:
    """A prepared gpu_only engine: the reference decode on a device goes through the same
    executor as every system (every expert resident, computed by the GPU kernels)."""
    geometry = loaded.nominal
    engine = OffloadEngine(make_system("gpu_only", {}), geometry, geometry.num_experts, cost)
    engine.prepare(None, steps)
    return engine
