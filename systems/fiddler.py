"""Fiddler-style offloading (DESIGN section 7).

Static placement from the popularity (token-expert pairs per (layer, expert)) of the
calibration trace. DESIGN ranks (layer, expert) pairs globally with B x L slots; under
the engine's per-layer capacity B (DESIGN 4: the budget is B experts per layer, and the
oracle bound is per layer) a global ranking fills exactly B slots in every layer, i.e. it
is each layer's top-B by popularity (ties to the lower id).

Per miss with n tokens: compute on the CPU if cpu_time(n) <= copy_time + gpu_time(n),
else copy the weights to a scratch buffer for this use only (never cached). Placement
never changes. CPU and GPU work run one after the other (no overlap): the rule compares
per-expert sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.errors import HarnessError
from harness.tau_solver import top_b_mask
from systems.base import LayerPlan, PrepareContext, System, resident_mask


@dataclass
class FiddlerConfig:
    name: str = "fiddler"


class Fiddler(System):
    name = "fiddler"
    overlap = False
    needs_calibration = True

    def __init__(self) -> None:
        super().__init__()
        self.popularity: torch.Tensor | None = None

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        if ctx.calibration is None or len(ctx.calibration) == 0:
            raise HarnessError("system=fiddler needs a calibration trace for its popularity profile")
        self.popularity = ctx.calibration.loads.long().sum(0)  # [L, E]

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        assert self.popularity is not None, "prepare() first"
        # top-B by popularity; experts never routed in calibration fill the rest by id
        ranked = top_b_mask(self.popularity * 2 + 1, capacity)
        return [set(torch.nonzero(row).flatten().tolist()) for row in ranked]

    def prefers_cpu(self, n_tokens: int) -> bool:
        cost = self.ctx.cost
        return cost.cpu_expert_time(n_tokens) <= cost.copy_time(1) + cost.gpu_expert_time(n_tokens)

    def plan(
        self, layer: int, load: torch.Tensor, hint: torch.Tensor | None, resident: frozenset[int]
    ) -> LayerPlan:
        routed = load > 0
        held = resident_mask(resident, routed.shape[0])
        cost = self.ctx.cost  # the per-miss rule of prefers_cpu, for all experts at once
        cheaper_on_cpu = cost.cpu_expert_times(load) <= cost.copy_time(1) + cost.gpu_expert_times(load)
        miss = routed & ~held
        to_scratch = miss & ~cheaper_on_cpu
        scratch = torch.nonzero(to_scratch).flatten().tolist()
        return LayerPlan(
            gpu=(routed & held) | to_scratch,
            cpu=miss & cheaper_on_cpu,
            fetch_sync=list(scratch),
            scratch=scratch,
        )
