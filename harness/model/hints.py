"""Next-layer hints: what a MoE layer tells the engine about the next MoE layer's loads.

A hint is a predicted load [E] (fp32) of MoE layer l + 1, computed at layer l from that
layer's router input x_l [T, H], and summed over the T token rows. Two channels
(docs/dali-and-gem.md "Prefetch: the predictor"):

- `next_gate`: layer l + 1's router probabilities on x_l (the next layer's gate applied
  to this layer's input). mixtral_offload's prefetch, and dali with `predictor=next_gate`.
- `residual`: layer l + 1's router probabilities on x_l - mean_l, where mean_l is the
  running mean of layer l's router input over every token row it has seen before this
  forward (zero before its first forward, so a first forward's residual hint equals its
  next_gate one). The harness's reading of DALI's residual-based prefetching.

`RunningMean` keeps mean_l: a float64 sum of the rows and their count, updated with a
forward's rows after that forward's hint (`update`), and reset when a model is attached
to an engine, so a recording and a live run of the same forwards see the same means.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NEXT_GATE = "next_gate"
RESIDUAL = "residual"
HINT_CHANNELS = (NEXT_GATE, RESIDUAL)

HintFn = Callable[[str], torch.Tensor]  # channel -> the next MoE layer's predicted load [E] (fp32)


class RunningMean:
    """The mean of every router-input row a MoE layer has seen (see the module docstring)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None  # float64 [H]
        self.count = 0

    def reset(self) -> None:
        self.total, self.count = None, 0

    def mean(self, like: torch.Tensor) -> torch.Tensor:
        """fp32 [H] on `like`'s device: the rows seen so far, averaged (zeros before any)."""
        if self.total is None or self.count == 0:
            return torch.zeros(like.shape[-1], dtype=torch.float32, device=like.device)
        return (self.total / self.count).to(torch.float32)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """x - mean, computed in fp32 and returned in x's dtype (what the next router reads)."""
        return (x.float() - self.mean(x)).to(x.dtype)

    def update(self, x: torch.Tensor) -> None:
        """Add a forward's rows x [T, H] (after its hint was computed)."""
        rows = x.reshape(-1, x.shape[-1])
        summed = rows.double().sum(0)
        self.total = summed if self.total is None else self.total + summed
        self.count += rows.shape[0]


def channel_hint(channel: str, router_sum: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                 mean: RunningMean) -> torch.Tensor:
    """The hint of `channel`: `router_sum(rows)` is the next router's probabilities summed
    over the rows; next_gate feeds it x, residual feeds it x - mean."""
    if channel == NEXT_GATE:
        return router_sum(x)
    if channel == RESIDUAL:
        return router_sum(mean.residual(x))
    raise ValueError(f"unknown hint channel {channel!r}; the channels are {', '.join(HINT_CHANNELS)}")
