"""Routing traces: per (forward, MoE layer) expert loads recorded from a live run.

A trace is what `System.prepare` learns from (calibration) and what replay runs over.

In memory: `steps` (one StepInfo per model forward) and `loads`, an int32 tensor
[n_steps, n_moe_layers, n_experts] of tokens routed to each expert; optional `hints`
(same shape, float32: the next layer's gate applied to this layer's hidden state,
summed as predicted loads; row l predicts layer l+1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from systems.base import StepInfo


@dataclass
class RoutingTrace:
    n_layers: int
    n_experts: int
    steps: list[StepInfo] = field(default_factory=list)
    _loads: list[torch.Tensor] = field(default_factory=list, repr=False)
    _hints: list[torch.Tensor | None] = field(default_factory=list, repr=False)

    def add_step(self, step: StepInfo) -> None:
        self.steps.append(step)
        self._loads.append(torch.zeros(self.n_layers, self.n_experts, dtype=torch.int32))
        self._hints.append(None)

    def record(self, layer: int, load: torch.Tensor, hint: torch.Tensor | None = None) -> None:
        """Record one layer's load for the current (last added) step."""
        self._loads[-1][layer] = load.to(torch.int32)
        if hint is not None:
            if self._hints[-1] is None:
                self._hints[-1] = torch.zeros(self.n_layers, self.n_experts, dtype=torch.float32)
            self._hints[-1][layer] = hint.float()

    @property
    def loads(self) -> torch.Tensor:
        if not self._loads:
            return torch.zeros(0, self.n_layers, self.n_experts, dtype=torch.int32)
        return torch.stack(self._loads)

    def __len__(self) -> int:
        return len(self.steps)
