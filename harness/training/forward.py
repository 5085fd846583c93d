"""A batched, differentiable forward of `LLaDA2Model` for training and bias calibration.

The inference forward (harness/model/llada2.py) runs one sequence under inference mode
and computes experts in the fixed order the lossless check needs. Training needs a
batch and gradients, and speed: routed experts are computed by grouping the (token,
expert) rows by expert into a padded [E, C, H] tensor and running one batched product per
projection (C = the largest expert load of the batch). It uses the model's own modules
and the same `route` function, so the trained weights mean the same thing in both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.model.llada2 import MoE, apply_partial_rope, block_causal_mask, rope_cos_sin, route


def attention(layer: torch.nn.Module, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
              mask: torch.Tensor) -> torch.Tensor:
    """x [B, S, H] -> [B, S, H] with the block-causal mask [S, S]."""
    attn = layer.attention
    b, s, _ = x.shape
    qkv = attn.query_key_value(x).view(b, s, attn.n_heads + 2 * attn.n_kv, attn.head_dim).transpose(1, 2)
    q, k, v = qkv.split([attn.n_heads, attn.n_kv, attn.n_kv], dim=1)
    q = apply_partial_rope(attn.query_layernorm(q), *rope)
    k = apply_partial_rope(attn.key_layernorm(k), *rope)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return attn.dense(out.transpose(1, 2).reshape(b, s, -1))


class ExpertStack(torch.nn.Module):
    """A MoE layer's routed experts as three stacked tensors: [E, I, H] gate and up, [E, H, I]
    down. Training optimizes these (three tensors a layer instead of 3 x 256 keeps the
    optimizer and the backward cheap); `write_back` copies them into the layer's experts."""

    def __init__(self, moe: MoE) -> None:
        super().__init__()
        with torch.no_grad():
            self.gate = torch.nn.Parameter(torch.stack([e.gate for e in moe.experts]).clone())
            self.up = torch.nn.Parameter(torch.stack([e.up for e in moe.experts]).clone())
            self.down = torch.nn.Parameter(torch.stack([e.down for e in moe.experts]).clone())

    def for_bmm(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[E, H, 2I] (gate|up, transposed) and [E, I, H] (down, transposed)."""
        return torch.cat((self.gate, self.up), dim=1).transpose(1, 2), self.down.transpose(1, 2)

    def write_back(self, moe: MoE) -> None:
        with torch.no_grad():
            for e, expert in enumerate(moe.experts):
                expert.gate.copy_(self.gate[e])
                expert.up.copy_(self.up[e])
                expert.down.copy_(self.down[e])
        moe.experts.replace(list(moe.experts))  # the stacked copies of the old values are stale


def stacked_experts(moe: MoE) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's experts in the layout of `ExpertStack.for_bmm`."""
    gate = torch.stack([e.gate for e in moe.experts])
    up = torch.stack([e.up for e in moe.experts])
    down = torch.stack([e.down for e in moe.experts])
    return torch.cat((gate, up), dim=1).transpose(1, 2), down.transpose(1, 2)


GROUP = 32  # experts per padded batch: experts of similar load are padded together


def grouped_experts(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor,
                    weights: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """sum_k w[n,k] * expert_{idx[n,k]}(x[n]) for x [N, H], via padded per-expert batches.

    The (token, expert) rows are sorted by expert; experts are taken in order of load,
    GROUP at a time, and each group's rows are padded to that group's largest load and
    run as one batched product per projection. Grouping by load keeps the padding small
    while the routing is still uneven (early in training)."""
    gate_up, down = weights
    n, k = idx.shape
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    counts = torch.bincount(flat, minlength=gate_up.shape[0])
    dev = idx.device
    rank = torch.arange(n * k, device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]  # place in its expert
    by_load = torch.argsort(counts, descending=True, stable=True)
    local = torch.empty_like(counts)
    local[by_load] = torch.arange(len(by_load), device=dev) % GROUP  # expert's place in its group
    group = torch.empty_like(counts)
    group[by_load] = torch.arange(len(by_load), device=dev) // GROUP
    row_group = group[sorted_e]
    picked, outputs = [], []
    for g in range(int(row_group.max()) + 1):
        sel = torch.nonzero(row_group == g).squeeze(1)  # sorted rows of this group's experts
        ids = by_load[g * GROUP:(g + 1) * GROUP]
        capacity = int(counts[ids[0]])
        if capacity == 0:
            break
        slot = local[sorted_e[sel]] * capacity + rank[sel]
        padded = x.new_zeros(len(ids) * capacity, x.shape[1]).index_copy(0, slot, x[order[sel] // k])
        gate, up = torch.bmm(padded.view(len(ids), capacity, -1), gate_up[ids]).chunk(2, dim=-1)
        out = torch.bmm(F.silu(gate) * up, down[ids]).reshape(len(ids) * capacity, -1)[slot]
        picked.append(sel)
        outputs.append(out)
    rows = torch.cat(outputs)[torch.argsort(torch.cat(picked))]  # back to expert-sorted row order
    rows = rows * w.reshape(-1)[order, None]
    return x.new_zeros(n, x.shape[1]).index_add(0, order // k, rows)


def moe_forward(moe: MoE, x: torch.Tensor, loads: list[torch.Tensor] | None,
                stack: ExpertStack | None = None) -> torch.Tensor:
    """x [B, S, H]; appends this layer's expert load [E] to `loads` when given. The routed
    experts come from `stack` when given (training), else from the expert modules."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    gate = moe.gate
    idx, w = route(gate.scores(flat), gate.expert_bias.float(), gate.top_k, gate.n_group, gate.topk_group,
                   gate.scale)
    if loads is not None:
        loads.append(torch.bincount(idx.reshape(-1), minlength=len(moe.experts)))
    weights = stack.for_bmm() if stack is not None else stacked_experts(moe)
    routed = grouped_experts(flat, idx, w.to(flat.dtype), weights)
    return (routed + moe.shared_experts(flat)).view(shape)


def batched_forward(model: torch.nn.Module, ids: torch.Tensor, block_length: int,
                    loads: list[torch.Tensor] | None = None, last: int | None = None,
                    stacks: list[ExpertStack] | None = None) -> torch.Tensor:
    """ids [B, S] (every row starts at position 0) -> logits [B, S, V] (fp32); with `last`,
    only the logits of the last `last` positions (the loss needs only the noisy block's).
    Runs on the device of `ids` (the model's)."""
    cfg = model.config
    positions = torch.arange(ids.shape[1])  # the rope and the mask are built on the host, as inference does
    cos, sin = rope_cos_sin(positions, cfg.rotary_dim, cfg.rope_theta)
    rope = (cos.to(ids.device), sin.to(ids.device))
    mask = block_causal_mask(positions, positions, block_length).to(ids.device)
    h = model.model.word_embeddings(ids)
    for layer in model.model.layers:
        h = h + attention(layer, layer.input_layernorm(h), rope, mask)
        x = layer.post_attention_layernorm(h)
        if isinstance(layer.mlp, MoE):
            stack = stacks[layer.mlp.moe_index] if stacks is not None else None
            h = h + moe_forward(layer.mlp, x, loads, stack)
        else:
            h = h + layer.mlp(x)
    if last is not None:
        h = h[:, -last:]
    return model.lm_head(model.model.norm(h)).float()
