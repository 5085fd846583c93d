"""gpu_only: every expert resident on the GPU, nothing moves. The lossless reference and
the ideal; it ignores B (the engine gives it room for all E experts) and reports whether
the whole model would fit the budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.placement.plan import LayerPlan
from harness.placement.system import PrepareContext, System
from systems.entry import SystemEntry, cost_free


@dataclass
class GpuOnlyConfig:
    name: str = "gpu_only"


class GpuOnly(System):
    name = "gpu_only"
    config_class = GpuOnlyConfig
    overlap = False
    ignores_budget = True  # the engine sizes its residency to E, not B

    def __init__(self, config: GpuOnlyConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self._nothing = np.zeros(0, bool)  # plan.cpu: no expert runs on the CPU

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        geometry = ctx.geometry
        self._fits = ctx.experts_per_layer >= geometry.num_experts
        self._model_gb = (
            geometry.non_expert_bytes()
            + geometry.n_moe_layers * geometry.num_experts * geometry.expert_bytes()
        ) / 1e9

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        return [set(range(n_experts)) for _ in range(n_layers)]

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        if self._nothing.shape[0] != load.shape[0]:
            self._nothing = np.zeros(load.shape[0], bool)
        return LayerPlan(gpu=load.astype(bool), cpu=self._nothing)  # loads are counts: routed where nonzero

    def report(self) -> dict[str, object]:
        # B >= E means the budget holds every expert of every layer (B is capped at E).
        return {"fits_budget": getattr(self, "_fits", None), "model_gb": getattr(self, "_model_gb", None)}


# a bound, not a contender; it never asks the cost model (every routed expert on the GPU)
ENTRY = SystemEntry(GpuOnly, GpuOnlyConfig, role="reference", decision_key=cost_free,
                    about="Every expert resident: the lossless reference and the ideal.")
