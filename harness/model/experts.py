"""Routed-expert computation in one fixed order, and the engine interface the MoE layer
hands it to.

Fixed order: every (token, expert) output is computed into its own row, then each token's
outputs are summed left to right in the column order of `topk_idx`. The sum never depends
on where or in which order the experts were computed, so whatever device a placement
policy picks for an expert, the layer output on one device is bit-identical to running
every expert in place (the lossless guarantee). Which column order: the MoE layer decides
(`model.expert_sum_order`, docs/model-and-decoding.md "Expert sum order"): `router`, the router's top-k
order as the reference sums (the default), or `expert_id`, ascending expert id. Either is
lossless: both are fixed before any placement decision.

Precision, as the reference: the routing weights stay fp32, so a bf16 model's expert
outputs are weighted and summed in fp32 (rows in the promoted dtype of activations and
weights); the MoE layer casts the sum back to the activations' dtype. With small experts
(proxies) the rows come from `gathered_expert_outputs`, a batched product that rounds a
bf16 row differently from the reference's per-expert `F.linear` (docs/model-and-decoding.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from harness.model.hints import HintFn


class ExpertWeights(NamedTuple):
    gate: torch.Tensor  # [I, H]
    up: torch.Tensor  # [I, H]
    down: torch.Tensor  # [H, I]


# Per-expert Python loops cost ~40 us an expert however small it is. When a layer's experts
# are small (proxy checkpoints), gathering each row's weights and computing all rows in
# one batched product is ~5x faster; real experts (MBs each) keep the loop.
GATHER_LIMIT_BYTES = 64 * 2**20


class ExpertBank(list):
    """A layer's experts, plus their weights stacked [E, ...] when they are small enough
    for the batched path (built once, on first use)."""

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not hasattr(self, "_stacked"):
            first = self[0]
            nbytes = len(self) * sum(t.numel() for t in first) * first.gate.element_size()
            self._stacked = None
            if nbytes <= GATHER_LIMIT_BYTES:
                gate_up = torch.stack([torch.cat((w.gate, w.up)) for w in self])  # [E, 2I, H]
                self._stacked = (gate_up, torch.stack([w.down for w in self]))  # [E, H, I]
        return self._stacked


PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # the checkpoint's names, in ExpertWeights order


class RoutedExperts(nn.Module):
    """A MoE layer's routed experts as E (gate, up, down) triples of plain tensors.

    Not 3E `nn.Linear` modules: the experts are only ever read as tensors (the engine, the
    device executor and training all take them that way), while 3 x 256 modules a layer
    cost seconds per model to construct, initialise and scan in `load_state_dict`. The
    state dict keeps the checkpoint's layout (`<prefix><e>.gate_proj.weight`, ...), and
    `.to()`-style conversions apply to the tensors as to parameters; they are not
    parameters, so autograd, optimizers and `model.parameters()` never see them (training
    optimizes stacked copies: harness/training/forward.py)."""

    def __init__(self, n_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        shapes = ((intermediate, hidden), (intermediate, hidden), (hidden, intermediate))
        # zeros, not garbage, for a model built to be initialised; but on the meta device (the
        # loader's skeleton) filling 3E tensors costs a second for nothing
        new = torch.empty if torch.get_default_device().type == "meta" else torch.zeros
        self.bank = ExpertBank(ExpertWeights(*(new(s) for s in shapes)) for _ in range(n_experts))

    def __len__(self) -> int:
        return len(self.bank)

    def __getitem__(self, e: int) -> ExpertWeights:
        return self.bank[e]

    def __iter__(self):
        return iter(self.bank)

    def replace(self, weights: list[ExpertWeights]) -> None:
        """Install new tensors (the loader's zero-copy views of a checkpoint); drops stale stacks."""
        self.bank = ExpertBank(weights)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for e, weights in enumerate(self.bank):
            for proj, tensor in zip(PROJECTIONS, weights, strict=True):
                destination[f"{prefix}{e}.{proj}.weight"] = tensor if keep_vars else tensor.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        assign = local_metadata.get("assign_to_params_buffers", False)
        expected, loaded = set(), []
        for e, weights in enumerate(self.bank):
            new = []
            for proj, tensor in zip(PROJECTIONS, weights, strict=True):
                key = f"{prefix}{e}.{proj}.weight"
                expected.add(key)
                given = state_dict.get(key)
                if given is None:
                    missing_keys.append(key)
                    new.append(tensor)
                elif given.shape != tensor.shape:
                    error_msgs.append(f"size mismatch for {key}: copying a param with shape {given.shape} from "
                                      f"checkpoint, the shape in current model is {tensor.shape}.")
                    new.append(tensor)
                elif assign:
                    new.append(given.detach())
                else:
                    with torch.no_grad():
                        new.append(tensor.copy_(given))
            loaded.append(ExpertWeights(*new))
        self.replace(loaded)
        if strict:
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in expected)

    def _apply(self, fn, recurse: bool = True):
        self.replace([ExpertWeights(*(fn(t) for t in weights)) for weights in self.bank])
        return super()._apply(fn, recurse)


def swiglu(x: torch.Tensor, w: ExpertWeights) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, w.gate)) * F.linear(x, w.up), w.down)


def expert_load(topk_idx: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens routed to each expert: int64 [E]."""
    return torch.bincount(topk_idx.reshape(-1), minlength=n_experts)


SUM_ORDERS = ("router", "expert_id")  # model.expert_sum_order


def sort_by_expert(topk_idx: torch.Tensor, topk_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's k choices in ascending expert id (expert_sum_order=expert_id)."""
    idx, perm = topk_idx.sort(dim=-1, stable=True)
    return idx, topk_w.gather(-1, perm)


class ExpertGroups(NamedTuple):
    """The rows of [T*K] grouped by expert: `order` lists the row indices expert by expert
    (tokens ascending), `ids` the routed experts ascending, `counts` their row counts."""

    order: torch.Tensor
    ids: list[int]
    counts: list[int]


def group_by_expert(topk_idx: torch.Tensor) -> ExpertGroups:
    flat_idx = topk_idx.reshape(-1)
    order = torch.argsort(flat_idx, stable=True)  # rows grouped by expert, tokens ascending
    ids, counts = torch.unique_consecutive(flat_idx[order], return_counts=True)
    return ExpertGroups(order, ids.tolist(), counts.tolist())


def weighted_expert_outputs(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
    experts: Sequence[ExpertWeights],
    only: torch.Tensor | None = None,
    buffer: torch.Tensor | None = None,
    groups: ExpertGroups | None = None,
) -> torch.Tensor:
    """w[t,k] * expert_{idx[t,k]}(x[t]) into buffer[t*K + k] (rows of [T*K, H]).

    The loop is over active experts, never over tokens. `only`: bool [E] to compute a
    subset (e.g. the experts placed on one device) into a shared buffer. `groups`: the
    grouping of `group_by_expert`, when the caller already has it (computed on the host,
    it spares a device the synchronizing `.tolist()`); its `order` lives with `x`.
    """
    k = topk_idx.shape[1]
    if buffer is None:
        buffer = x.new_zeros(topk_idx.numel(), x.shape[1], dtype=row_dtype(x, topk_w))
    order, ids, counts = groups if groups is not None else group_by_expert(topk_idx)
    weights = topk_w.reshape(-1)[order]
    start = 0
    for e, n in zip(ids, counts, strict=True):
        end = start + n
        if only is None or bool(only[e]):
            rows = order[start:end]
            buffer[rows] = swiglu(x[rows // k], experts[e]).to(buffer.dtype) * weights[start:end, None]
        start = end
    return buffer


def row_dtype(x: torch.Tensor, topk_w: torch.Tensor) -> torch.dtype:
    """The dtype weighted rows are computed and summed in: fp32 routing weights keep a bf16
    model's weighting and sum in fp32, as the reference's `moe_infer`."""
    return torch.promote_types(x.dtype, topk_w.dtype)


def combine(buffer: torch.Tensor, n_tokens: int, k: int) -> torch.Tensor:
    """Sum each token's k weighted outputs left to right: a fixed order on any device."""
    rows = buffer.view(n_tokens, k, -1)
    out = rows[:, 0].clone()
    for j in range(1, k):
        out += rows[:, j]
    return out


def compute_routed_experts(
    x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, experts: Sequence[ExpertWeights]
) -> torch.Tensor:
    """sum_k w[t,k] * expert_{idx[t,k]}(x[t]) for every token t, summed over k left to right
    (the order the MoE layer gave). x [T, H]; topk_idx [T, K]; topk_w [T, K].
    The sum is in `row_dtype` (fp32 for a bf16 model with fp32 weights)."""
    stacked = experts.stacked() if isinstance(experts, ExpertBank) else None
    rows = x.shape[0] * topk_idx.shape[1]
    if stacked is not None and rows * stacked[0][0].numel() * 3 // 2 * x.element_size() <= GATHER_LIMIT_BYTES:
        buffer = gathered_expert_outputs(x, topk_idx, topk_w, *stacked)
    else:
        buffer = weighted_expert_outputs(x, topk_idx, topk_w, experts)
    return combine(buffer, x.shape[0], topk_idx.shape[1])


def gathered_expert_outputs(
    x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """The rows of `weighted_expert_outputs`, computed by gathering each row's weights."""
    k = topk_idx.shape[1]
    flat = topk_idx.reshape(-1)
    xr = x.repeat_interleave(k, dim=0)
    # index_select, not gate_up[flat]: the same copy, ~8x faster than advanced indexing on the CPU
    gate, up = torch.einsum("rih,rh->ri", gate_up.index_select(0, flat), xr).chunk(2, dim=-1)
    h = F.silu(gate) * up
    out = torch.einsum("rhi,ri->rh", down.index_select(0, flat), h)
    return out.to(row_dtype(x, topk_w)) * topk_w.reshape(-1, 1)




class ExpertEngine(Protocol):
    """What a MoE layer hands its routed experts to.

    layer: MoE-layer index (0-based, dense layers not counted).
    hint_fn: hint_fn(channel) computes the next MoE layer's predicted load [E] on one of
    the hint channels (harness/model/hints.py: its gate on this layer's input, or on the
    input's deviation from the layer's running mean); None for the last MoE layer.
    Engines call it only for the channels they need.
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
