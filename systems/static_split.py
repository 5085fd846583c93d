"""A static GPU/CPU split: the baseline DALI compares against (docs/dali-and-gem.md).

Each layer's GPU set is fixed before the first forward: its top-B experts by the
calibration trace's popularity (token-expert pairs per (layer, expert); ties to the lower
id, experts never routed in calibration fill the rest by id), as fiddler places them. It
never changes: a routed expert in the set computes on the GPU, every other routed expert
on the CPU, and nothing is ever copied. CPU and GPU run concurrently (`overlap=true`, as
DALI's runtime runs both sides; false charges them one after the other).

It is fiddler without fiddler's per-miss rule (a miss heavy enough to be cheaper copied
goes to a one-use copy there) and with DALI's concurrent sides: the placement alone, with
no decision per step, so that DALI's per-step assignment, prefetch and replacement are
measured against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.accounting.ledger import LayerOutcomes
from harness.common.errors import HarnessError
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import PrepareContext, System
from systems.entry import SystemEntry
from systems.tide_tau import top_b_mask


@dataclass
class StaticSplitConfig:
    name: str = "static_split"
    overlap: bool = True  # CPU experts beside the GPU ones (DALI's setting); false: after them


class StaticSplit(System):
    name = "static_split"
    config_class = StaticSplitConfig
    overlap = True
    needs_calibration = True

    def __init__(self, config: StaticSplitConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self.popularity: torch.Tensor | None = None

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        if ctx.calibration is None or len(ctx.calibration) == 0:
            raise HarnessError("system=static_split needs a calibration trace for its GPU set")
        self.popularity = ctx.calibration.loads.long().sum(0)  # [L, E]

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        assert self.popularity is not None, "prepare() first"
        score = self.popularity * 2 + 1  # never-routed experts still rank (by id) after routed ones
        if self.ctx.budget_scope == "global":  # the B x L most popular (layer, expert) pairs
            ranked = top_b_mask(score.flatten(), capacity * n_layers).reshape(score.shape)
        else:
            ranked = top_b_mask(score, capacity)
        return [set(torch.nonzero(row).flatten().tolist()) for row in ranked]

    def plan(self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray) -> LayerPlan:
        routed = load.astype(bool)
        return LayerPlan(gpu=routed & resident, cpu=np.greater(routed, resident))


class StaticSplitBatchPlanner:
    """`StaticSplit.plan` for chunks of forwards: the placement never changes."""

    def __init__(self, system: StaticSplit, resident: np.ndarray) -> None:
        self.system, self.resident = system, resident

    def plan(self, loads: np.ndarray, steps: list[StepInfo]) -> LayerOutcomes:
        routed = loads > 0
        zeros = np.zeros(loads.shape[:2], np.int64)
        return LayerOutcomes(loads, routed & self.resident, routed & ~self.resident, zeros, zeros, zeros)

    def residency(self) -> np.ndarray:
        return self.resident


ENTRY = SystemEntry(StaticSplit, StaticSplitConfig, StaticSplitBatchPlanner,
                    invariant_options=({}, {"overlap": False}),
                    about="A static GPU/CPU split, DALI's baseline: each layer's calibration top-B on the GPU, "
                          "the rest on the CPU.")
