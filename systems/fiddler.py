"""Fiddler-style offloading (docs/systems.md).

Static placement from the popularity (token-expert pairs per (layer, expert)) of the
calibration trace. The first design (docs/systems.md) ranks (layer, expert) pairs globally with B x L slots; under
the engine's per-layer capacity B (docs/systems.md: the budget is B experts per layer, and the
oracle bound is per layer) a global ranking fills exactly B slots in every layer, i.e. it
is each layer's top-B by popularity (ties to the lower id). Under `budget.scope=global`
(B x L experts in total, any split) it is that global ranking itself: the B x L most popular
(layer, expert) pairs over the whole model (ties to the lower layer, then the lower id),
so popular layers hold more experts than others.

Per miss with n tokens: compute on the CPU if cpu_time(n) <= copy_time + gpu_time(n),
else copy the weights to a scratch buffer for this use only (never cached). Placement
never changes. CPU and GPU work run one after the other (no overlap): the rule compares
per-expert sums.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.accounting.ledger import LayerOutcomes
from harness.common.errors import HarnessError
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import ExpertCosts, PrepareContext, System
from systems.entry import SystemEntry
from systems.tide_tau import top_b_mask


@dataclass
class FiddlerConfig:
    name: str = "fiddler"
    overlap: bool = False  # the original runs CPU and GPU experts one after the other; true charges max(GPU, CPU)


class Fiddler(System):
    name = "fiddler"
    config_class = FiddlerConfig
    overlap = False
    needs_calibration = True

    def __init__(self, config: FiddlerConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self.popularity: torch.Tensor | None = None
        self._rule = np.zeros(0, bool)  # cheaper_on_cpu per load

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        if ctx.calibration is None or len(ctx.calibration) == 0:
            raise HarnessError("system=fiddler needs a calibration trace for its popularity profile")
        self.popularity = ctx.calibration.loads.long().sum(0)  # [L, E]

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        assert self.popularity is not None, "prepare() first"
        # top-B by popularity; experts never routed in calibration fill the rest by id
        score = self.popularity * 2 + 1
        if self.ctx.budget_scope == "global":  # the B x L most popular (layer, expert) pairs
            ranked = top_b_mask(score.flatten(), capacity * n_layers).reshape(score.shape)
        else:
            ranked = top_b_mask(score, capacity)
        return [set(torch.nonzero(row).flatten().tolist()) for row in ranked]

    def prefers_cpu(self, n_tokens: int) -> bool:
        """One miss of `n_tokens`: on the CPU if that is no slower than a copy plus the
        GPU.
        Reference definition: only tests call this (plans use `cheaper_on_cpu`)."""
        cost = self.ctx.cost
        return cost.cpu_expert_time(n_tokens) <= cost.copy_time(1) + cost.gpu_expert_time(n_tokens)

    def cheaper_on_cpu(self, loads: np.ndarray) -> np.ndarray:
        """The per-miss rule of prefers_cpu for every entry of an int array of loads
        (negative loads as 0), tabulated per load from the cost model's tables of its
        vector functions."""
        loads = np.maximum(loads, 0)
        self._tabulate(int(loads.max()) if loads.size else 0)
        return self._rule[loads]

    def _tabulate(self, top: int) -> None:
        """The rule for every load up to at least `top`."""
        if top >= len(self._rule):
            self._rule = cheaper_on_cpu_table(self.ctx.cost, top)

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        routed = load.astype(bool)  # loads are counts
        miss = np.greater(routed, resident)
        self._tabulate(int(load.max()))  # loads are counts: the rule indexes them as they are
        to_scratch = np.greater(miss, self._rule[load])  # a miss not cheaper on the CPU is copied
        if not np.count_nonzero(to_scratch):  # the common case: every miss computes on the CPU
            return LayerPlan(gpu=routed & resident, cpu=miss)
        scratch = np.flatnonzero(to_scratch)
        return LayerPlan(gpu=(routed & resident) | to_scratch, cpu=miss & ~to_scratch, fetch_sync=scratch,
                         scratch=scratch)


def cheaper_on_cpu_table(cost: ExpertCosts, top: int) -> np.ndarray:
    """bool [n], n > top: `prefers_cpu` of every load 0..n-1, from the cost model's tables
    (a miss with n tokens computes on the CPU iff cpu(n) <= one copy + gpu(n))."""
    n = max(len(cost.time_table("gpu", top)), len(cost.time_table("cpu", top)))
    gpu, cpu = cost.time_table("gpu", n - 1)[:n], cost.time_table("cpu", n - 1)[:n]
    return cpu <= cost.copy_time(1) + gpu


def decision_key(system: System, cost: ExpertCosts, top: int) -> Hashable:
    """Fiddler's placement is static and a miss goes to the CPU or a scratch copy by its load
    alone: its decisions over a trace whose loads reach `top` are its rule on loads 0..top."""
    return cheaper_on_cpu_table(cost, top)[: top + 1].tobytes()


class FiddlerBatchPlanner:
    """`Fiddler.plan` for chunks of forwards (fiddler's batch planner in systems/registry.py):
    placement is static, a miss goes to the CPU or to a scratch copy by its load alone."""

    def __init__(self, system: Fiddler, resident: np.ndarray) -> None:
        self.system, self.resident = system, resident

    def plan(self, loads: np.ndarray, steps: list[StepInfo]) -> LayerOutcomes:
        routed = loads > 0
        miss = routed & ~self.resident
        to_scratch = miss & ~self.system.cheaper_on_cpu(loads)
        zeros = np.zeros(loads.shape[:2], np.int64)
        return LayerOutcomes(loads, (routed & self.resident) | to_scratch, miss, zeros, to_scratch.sum(-1), zeros)

    def residency(self) -> np.ndarray:
        return self.resident


ENTRY = SystemEntry(Fiddler, FiddlerConfig, FiddlerBatchPlanner, role="baseline", decision_key=decision_key,
                    about="Fiddler-style static placement, misses on the CPU or copied once.")
