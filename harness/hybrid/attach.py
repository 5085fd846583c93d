"""Putting a loaded model on a device for hybrid execution.

`attach(model, runtime)` moves every non-expert module (embeddings, attention, norms,
router, shared experts, dense layers, lm_head) to the runtime's device in its dtype (bf16
on CUDA; the router stays fp32, as the model computes routing in fp32), and copies each
MoE layer's routed experts into one stacked host buffer per weight, pinned, so a slot copy
is an asynchronous DMA. Routed experts never go to the device here: only the executor's
slot pools and one-use buffers hold them there. The KV cache follows the attention
outputs onto the device.

Pinned memory cannot be paged out, so pinning more than the host can spare would starve
it (LLaDA2.0-flash's routed experts are ~200 GB in bf16). When the experts need more than
`PIN_FRACTION` of the host's available memory, they stay pageable: the checkpoint's own
tensors (memory-mapped, zero-copy) when they already have the device dtype, pageable
stacks otherwise. Copies from pageable memory are correct but synchronous for the host
thread (the driver stages them), so asynchronous migration then cannot overlap compute;
the run records `host_experts_pinned` = 0 and says so on stderr.

`wrap(model, engine)` (harness/hybrid/executor.py) is what a decode hands its MoE layers to: the engine itself for a
model left on the host (the cpu backend), a `HybridExecutor` around it for an attached one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from harness.hybrid.device import Runtime
from harness.model.experts import ExpertWeights
from harness.model.llada2 import LLaDA2Model, Router

PIN_FRACTION = 0.5  # of the host's available memory, at most, for pinned experts


def experts_nbytes(experts: Sequence[ExpertWeights], dtype: torch.dtype) -> int:
    per_expert = sum(w.numel() for w in experts[0]) * torch.empty((), dtype=dtype).element_size()
    return len(experts) * per_expert


class HostExperts:
    """One MoE layer's routed experts in host memory: `views[e]` per expert; stacked [E, ...]
    per weight unless they are the checkpoint's own tensors (pageable, right dtype)."""

    def __init__(self, runtime: Runtime, experts: Sequence[ExpertWeights], dtype: torch.dtype,
                 pinned: bool = True) -> None:
        self.pinned = pinned
        self.nbytes = experts_nbytes(experts, dtype)
        if not pinned and all(w.dtype == dtype and w.is_contiguous() for w in experts[0]):
            self.stacks: tuple[torch.Tensor, ...] = ()
            self.views = [ExpertWeights(*w) for w in experts]  # zero-copy: no second host copy
            return
        first = experts[0]
        self.stacks = tuple(runtime.host_empty((len(experts), *w.shape), dtype, pinned) for w in first)
        for e, weights in enumerate(experts):
            for stack, w in zip(self.stacks, weights, strict=True):
                stack[e].copy_(w)  # converts to the device dtype; pages a mmap'd checkpoint in once
        self.views = [ExpertWeights(*(s[e] for s in self.stacks)) for e in range(len(experts))]


def should_pin(runtime: Runtime, need_bytes: int) -> bool:
    """Pin the host experts unless they would take more than PIN_FRACTION of what the host
    has available (unknown: pin)."""
    available = runtime.host_available()
    return available is None or need_bytes <= PIN_FRACTION * available


@dataclass
class DevicePlacement:
    runtime: Runtime
    host: list[HostExperts]  # per MoE layer
    non_expert_bytes: int  # parameters and buffers placed on the device by `attach`

    @property
    def host_pinned(self) -> bool:
        return all(h.pinned for h in self.host)

    @property
    def host_expert_bytes(self) -> int:
        return sum(h.nbytes for h in self.host)


def _move_module(module: nn.Module, device: torch.device, dtype: torch.dtype | None) -> int:
    """Move one module's own parameters and buffers (not its children's); returns bytes."""
    keep_fp32 = isinstance(module, Router)
    moved = 0
    for name, param in list(module.named_parameters(recurse=False)):
        target = torch.float32 if keep_fp32 else (dtype or param.dtype)
        if param.device != device or param.dtype != target:
            param = nn.Parameter(param.detach().to(device, target), requires_grad=False)
            setattr(module, name, param)
        moved += param.numel() * param.element_size()
    for name, buf in list(module.named_buffers(recurse=False)):
        if buf.device != device:
            buf = buf.to(device)  # the expert bias keeps its dtype: it only selects
            setattr(module, name, buf)
        moved += buf.numel() * buf.element_size()
    return moved


def expert_modules(model: LLaDA2Model) -> set[int]:
    """ids of every MoE layer's routed-experts module (its tensors are placed by HostExperts)."""
    return {id(moe.experts) for moe in model.moe_layers()}


def attach(model: LLaDA2Model, runtime: Runtime) -> DevicePlacement:
    """Place `model` for hybrid execution on `runtime` (see the module docstring)."""
    if placement_of(model) is not None:
        raise RuntimeError("the model is already attached to a device")
    skip = expert_modules(model)
    moved = sum(_move_module(m, runtime.device, runtime.dtype) for m in model.modules() if id(m) not in skip)
    layers = [(moe.expert_weights, runtime.dtype or moe.expert_weights[0].gate.dtype) for moe in model.moe_layers()]
    need = sum(experts_nbytes(experts, dtype) for experts, dtype in layers)
    pinned = should_pin(runtime, need)
    if not pinned:
        available = runtime.host_available() or 0
        print(f"warning: the routed experts need {need / 1e9:.1f} GB of pinned host memory, more than "
              f"{PIN_FRACTION:.0%} of the {available / 1e9:.1f} GB available: they stay pageable, so weight "
              "copies are synchronous for the host and cannot overlap compute", file=sys.stderr)
    host = [HostExperts(runtime, experts, dtype, pinned) for experts, dtype in layers]
    placement = DevicePlacement(runtime, host, moved)
    model.placement = placement  # read by `placement_of`; a plain attribute, not a submodule
    return placement


def placement_of(model: LLaDA2Model) -> DevicePlacement | None:
    return getattr(model, "placement", None)
