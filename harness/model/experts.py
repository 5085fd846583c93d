"""Routed-expert computation in one canonical order, and the engine interface the MoE
layer hands it to.

Canonical order: experts by ascending id; within an expert, tokens in ascending order;
each expert's weighted output is added into the result in that order. Whatever device a
placement policy picks for an expert, combining in this order makes the layer output on
one device bit-identical to running every expert in place (the lossless guarantee).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F


class ExpertWeights(NamedTuple):
    gate: torch.Tensor  # [I, H]
    up: torch.Tensor  # [I, H]
    down: torch.Tensor  # [H, I]


def swiglu(x: torch.Tensor, w: ExpertWeights) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, w.gate)) * F.linear(x, w.up), w.down)


def expert_load(topk_idx: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens routed to each expert: int64 [E]."""
    return torch.bincount(topk_idx.reshape(-1), minlength=n_experts)


def compute_routed_experts(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
    experts: Sequence[ExpertWeights],
    only: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_k w[t,k] * expert_{idx[t,k]}(x[t]) for every token t, in canonical order.

    x [T, H]; topk_idx [T, K] int64; topk_w [T, K] in x's dtype. `only`: bool [E] to
    compute a subset of the experts (adding into `out`); the loop is over active
    experts, never over tokens.
    """
    if out is None:
        out = torch.zeros_like(x)
    flat_idx = topk_idx.reshape(-1)
    order = torch.argsort(flat_idx, stable=True)  # by expert id, then token, then slot
    sorted_experts = flat_idx[order]
    tokens = order // topk_idx.shape[1]
    weights = topk_w.reshape(-1)[order]
    ids, counts = torch.unique_consecutive(sorted_experts, return_counts=True)
    start = 0
    for e, n in zip(ids.tolist(), counts.tolist(), strict=True):
        end = start + n
        if only is None or bool(only[e]):
            tok = tokens[start:end]
            y = swiglu(x[tok], experts[e]) * weights[start:end, None]
            out.index_add_(0, tok, y)
        start = end
    return out


HintFn = Callable[[], torch.Tensor]


class ExpertEngine(Protocol):
    """What a MoE layer hands its routed experts to.

    layer: MoE-layer index (0-based, dense layers not counted).
    hint_fn: computes the next MoE layer's predicted load [E] (its gate applied to this
    layer's input); None for the last MoE layer. Engines call it only if they need it.
    """

    def run_experts(
        self,
        layer: int,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_w: torch.Tensor,
        experts: Sequence[ExpertWeights],
        hint_fn: HintFn | None,
    ) -> torch.Tensor: ...


class LocalExperts:
    """The plain engine: every expert computed in place, nothing recorded."""

    def run_experts(self, layer, x, topk_idx, topk_w, experts, hint_fn):
        return compute_routed_experts(x, topk_idx, topk_w, experts)
