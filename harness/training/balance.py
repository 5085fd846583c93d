"""Auxiliary-loss-free expert balancing (DeepSeek-V3, used by LLaDA2.0).

Each MoE router adds a per-expert bias to its scores when it *selects* experts; the
combine weights use the unbiased scores (harness/model/llada2.route). After each step the
bias of every expert that took more than the mean load goes down by a constant and the
bias of every expert that took less goes up by it, so over-used experts lose tokens to
idle ones without a loss term that fights the language-model objective.
"""

from __future__ import annotations

import torch


def balance_update(bias: torch.Tensor, load: torch.Tensor, rate: float) -> torch.Tensor:
    """The new bias: bias + rate * sign(mean load - load), per expert (shape [E] or [L, E])."""
    load = load.float()
    mean = load.mean(dim=-1, keepdim=True)
    return bias + rate * torch.sign(mean - load)


def apply_balance(routers: list[torch.nn.Module], loads: list[torch.Tensor], rate: float) -> None:
    """Update every router's `expert_bias` buffer in place from its layer's load."""
    with torch.no_grad():
        for router, load in zip(routers, loads, strict=True):
            router.expert_bias.copy_(balance_update(router.expert_bias, load, rate))


def imbalance(loads: list[torch.Tensor]) -> float:
    """Max load over mean load, averaged over layers (1.0 = perfectly even)."""
    ratios = [float(load.max()) / max(float(load.float().mean()), 1e-9) for load in loads]
    return sum(ratios) / max(len(ratios), 1)
