"""What a live run (harness/job/live.py) needs from the hybrid backend, in one place.

The all-GPU engine: the reference tokens and the recorded routing (calibration, workload)
come from a decode that computes every routed expert with the GPU kernels. With every
expert resident that is gpu_only; when the device cannot hold all E experts of every
layer (LLaDA2.0-flash's are ~200 GB in bf16) it is mixtral_offload with as many slots per
layer as fit: still every expert computed on the GPU, the missing ones copied in first.
Each expert's output depends only on its weights and its tokens, not on where the weights
were a moment before, so both decode the same tokens; streaming only costs time, and
these decodes are not timed.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING

import torch

from harness.accounting.cost import CostModel
from harness.common.errors import HarnessError
from harness.common.files import fingerprint
from harness.decode.loading import LoadedModel
from harness.engine.engine import OffloadEngine
from harness.hybrid.attach import attach, placement_of
from harness.hybrid.device import CudaRuntime, StandInRuntime
from harness.placement.system import MoEGeometry
from harness.placement.trace import RoutingTrace
from harness.zoo.entry import load_model
from systems.registry import make_system

if TYPE_CHECKING:
    from harness.job.config import HarnessConfig

RESERVE_FRACTION = 0.1  # of the device's memory, kept for activations, the KV cache, allocator slack
RESERVE_MIN_BYTES = 2 * 2**30


def load_on_device(cfg: HarnessConfig, backend: str) -> LoadedModel:
    """The model of `cfg.model`, attached to the device of `backend` (cuda or standin).
    On CUDA the weights are loaded in bf16, the dtype they run in there: a bf16 checkpoint
    then stays a zero-copy memory map instead of being widened to fp32 on the host first.
    The stand-in keeps the configured dtype, as the cpu backend does."""
    if backend == "cuda":
        loaded = load_model(dataclasses.replace(cfg.model, dtype="bfloat16"), cfg.cache_dir)
        attach(loaded.model, CudaRuntime())
    elif backend == "standin":
        loaded = load_model(cfg.model, cfg.cache_dir)
        attach(loaded.model, StandInRuntime())
    else:
        raise ValueError(f"backend {backend!r} has no device")
    return loaded


def reference_key(key: str, backend: str) -> str:
    """The cached reference tokens of a backend. CUDA references are per GPU model and torch
    build, since kernels (and so roundings) differ between them; the stand-in's are its own."""
    if backend == "cpu":
        return key
    device = torch.cuda.get_device_name() if backend == "cuda" else "cpu"
    return fingerprint({"reference": key, "backend": backend, "device": device, "torch": torch.__version__})


def fitting_slots(free_bytes: int, total_bytes: int, slot_bytes: int, n_layers: int, n_experts: int) -> int:
    """Expert slots per layer the device can hold: E when every expert fits, else the most
    that leave room for one layer's worst case of one-use copies (all E experts routed,
    the non-resident ones copied for this layer only) beside the reserve."""
    usable = free_bytes - max(RESERVE_MIN_BYTES, int(RESERVE_FRACTION * total_bytes))
    if n_layers * n_experts * slot_bytes <= usable:
        return n_experts
    if n_layers == 1:
        return 0 if usable < n_experts * slot_bytes else n_experts
    return max(0, min(n_experts, (usable - n_experts * slot_bytes) // ((n_layers - 1) * slot_bytes)))


def all_gpu_engine(loaded: LoadedModel, cost: CostModel, steps: int, trace: RoutingTrace | None = None
                   ) -> OffloadEngine:
    """A prepared engine whose plans compute every routed expert on the GPU (see the module
    docstring); on a model left on the host, simply gpu_only."""
    geometry = loaded.nominal
    slots = geometry.num_experts
    placement = placement_of(loaded.model)
    memory = placement.runtime.device_memory() if placement is not None else None
    if memory is not None:
        slots = fitting_slots(*memory, slot_bytes(loaded, placement.runtime.dtype), geometry.n_moe_layers,
                              geometry.num_experts)
    if slots == geometry.num_experts:
        engine = OffloadEngine(make_system("gpu_only", {}), geometry, slots, cost, trace=trace)
    else:
        check_streamable(slots, memory, geometry)
        print(f"note: {geometry.num_experts} experts x {geometry.n_moe_layers} layers do not fit in the "
              f"{memory[0] / 1e9:.1f} GB free on the device: the all-GPU decode streams them through "
              f"{slots} slots per layer", file=sys.stderr)
        engine = OffloadEngine(make_system("mixtral_offload", {}), geometry, slots, cost, trace=trace)
    engine.prepare(None, steps)
    return engine


def slot_bytes(loaded: LoadedModel, dtype: torch.dtype | None) -> int:
    weights = loaded.model.moe_layers()[0].expert_weights[0]
    size = torch.empty((), dtype=dtype or weights.gate.dtype).element_size()
    return sum(w.numel() for w in weights) * size


def check_streamable(slots: int, memory: tuple[int, int] | None, geometry: MoEGeometry) -> None:
    if slots < 1:
        free = memory[0] / 1e9 if memory else 0.0
        raise HarnessError(
            f"the device has {free:.1f} GB free after the non-expert weights, too little for one expert slot "
            f"per layer and one layer's {geometry.num_experts} one-use expert copies; use a GPU with more memory "
            "or a smaller model"
        )
