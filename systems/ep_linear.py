"""ep_linear: expert parallelism with vLLM's default static mapping (docs/systems.md).

topology=multi only. GPU r owns a contiguous range of expert ids, the same in every MoE
layer: expert e lives on GPU floor(e * G / E), so with E divisible by G every GPU owns
E / G experts (otherwise the ranges differ by at most one). Every expert is resident on
its GPU and computed there; nothing is offloaded and nothing moves, so the output is the
gpu_only output. The engine charges each layer as its slowest GPU's time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.placement.plan import LayerPlan
from harness.placement.system import PrepareContext, System
from systems.entry import SystemEntry


@dataclass
class EpLinearConfig:
    name: str = "ep_linear"


def linear_mapping(n_experts: int, n_gpus: int) -> torch.Tensor:
    """GPU of every expert: contiguous ranges of ids, sizes differing by at most one."""
    return torch.arange(n_experts) * n_gpus // n_experts


def expert_parallel_plan(load: np.ndarray, device: torch.Tensor) -> LayerPlan:
    """Every routed expert on its GPU, nothing on the CPU, nothing moved."""
    routed = load > 0
    return LayerPlan(gpu=routed, cpu=np.zeros_like(routed), device=device)


class EpLinear(System):
    name = "ep_linear"
    config_class = EpLinearConfig
    overlap = False
    ignores_budget = True  # every expert resident (on some GPU): the budget B does not apply
    multi_gpu = True

    def __init__(self, config: EpLinearConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self.mapping: torch.Tensor | None = None  # [E]

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.mapping = linear_mapping(ctx.geometry.num_experts, ctx.topology.n_gpus)

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        return [set(range(n_experts)) for _ in range(n_layers)]

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        assert self.mapping is not None, "prepare() first"
        return expert_parallel_plan(load, self.mapping)

    def report(self) -> dict[str, object]:
        speeds = self.ctx.topology.speeds
        return {"gpu_speeds": list(speeds), "slowest_gpu_speed": min(speeds)}


ENTRY = SystemEntry(EpLinear, EpLinearConfig,
                    about="Expert parallelism with vLLM's default contiguous mapping; needs topology=multi.")
