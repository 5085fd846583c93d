"""LLaDA2-MoE in plain torch, single device.

One forward takes a window of token ids with their positions and returns logits. Two
ways to call it, matching the decoding loop's cache modes:
- no cache: the window starts at position 0; attention is block-causal;
- prefix cache: the window is the current block; keys/values of finished blocks come
  from a `KVCache` and every query sees all of them.
Routed experts are handed to an `ExpertEngine` (see experts.py), so placement policies
plug in without this file knowing about them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from harness.common.errors import HarnessError
from harness.model.config import LLaDA2Config
from harness.model.experts import (
    SUM_ORDERS,
    ExpertBank,
    ExpertEngine,
    ExpertWeights,
    LocalExperts,
    RoutedExperts,
    sort_by_expert,
    swiglu,
)
from harness.model.hints import RunningMean, channel_hint


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, rotary_dim]
    return emb.cos(), emb.sin()


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [heads, T, head_dim]; only the first rotary_dim dims rotate (partial rotary)."""
    rd = cos.shape[-1]
    rot, keep = x[..., :rd], x[..., rd:]
    rot = rot * cos.to(x.dtype) + rotate_half(rot) * sin.to(x.dtype)
    return torch.cat((rot, keep), dim=-1)


def block_causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, block_length: int) -> torch.Tensor:
    """True where query i may attend key j: j's block is not after i's block."""
    return (k_pos[None, :] // block_length) <= (q_pos[:, None] // block_length)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scaling: float) -> torch.Tensor:
    """The reference's `eager_attention_forward`, op for op, so a bf16 model rounds as it
    does: scores (q k^T * scaling) in the model dtype, an additive 0/-inf mask, softmax in
    fp32 cast back, then the product with v. q [H, T, D]; k, v [KV, S, D]; mask bool [T, S]."""
    n_rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(n_rep, dim=0), v.repeat_interleave(n_rep, dim=0)  # head h reads kv h // n_rep
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    additive = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    probs = F.softmax(scores + additive, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


@dataclass
class KVCache:
    """Keys/values of finished blocks, per layer: [kv_heads, T_cached, head_dim]."""

    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.keys or self.keys[0] is None else self.keys[0].shape[1]


class Attention(nn.Module):
    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv_out = (self.n_heads + 2 * self.n_kv) * self.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, qkv_out, bias=False)
        self.dense = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.query_layernorm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.key_layernorm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        t = x.shape[0]
        qkv = self.query_key_value(x).view(t, self.n_heads + 2 * self.n_kv, self.head_dim).transpose(0, 1)
        q, k, v = qkv.split([self.n_heads, self.n_kv, self.n_kv], dim=0)
        q = apply_partial_rope(self.query_layernorm(q), *rope)
        k = apply_partial_rope(self.key_layernorm(k), *rope)
        new_kv = (k, v)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1)
        out = eager_attention(q, k, v, mask, self.head_dim**-0.5)
        return self.dense(out.transpose(0, 1).reshape(t, -1)), new_kv


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def weights(self) -> ExpertWeights:
        return ExpertWeights(self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.weights())


class Router(nn.Module):
    """Sigmoid router with group-limited top-k; the expert bias only selects."""

    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts))
        self.top_k, self.n_group, self.topk_group = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.scale = cfg.routed_scaling_factor

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(F.linear(x.float(), self.weight.float()))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return route(self.scores(x), self.expert_bias.float(), self.top_k, self.n_group, self.topk_group, self.scale)


def route(
    scores: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores: sigmoid gate outputs [T, E] (fp32). Returns (topk_idx [T, k], weights [T, k])."""
    t, e = scores.shape
    biased = scores + bias
    group_scores = biased.view(t, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
    keep_groups = group_scores.topk(topk_group, dim=-1).indices
    group_mask = torch.zeros(t, n_group, dtype=torch.bool, device=scores.device)
    group_mask.scatter_(1, keep_groups, True)
    expert_mask = group_mask.repeat_interleave(e // n_group, dim=1)
    masked = biased.masked_fill(~expert_mask, float("-inf"))
    idx = masked.topk(top_k, dim=-1).indices
    w = scores.gather(1, idx)
    if top_k > 1:  # as the reference: a single routed expert keeps its raw gate score
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * scale


class MoE(nn.Module):
    def __init__(self, cfg: LLaDA2Config, moe_index: int) -> None:
        super().__init__()
        self.moe_index = moe_index
        self.gate = Router(cfg)
        self.experts = RoutedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_experts = DenseMLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.num_shared_experts)
        self.sum_order = "router"  # LLaDA2Model.set_expert_sum_order
        self.running_mean = RunningMean()  # of this layer's router input: the residual hint's (reset on attach)

    @property
    def expert_weights(self) -> ExpertBank:
        """The routed experts as the engine reads them: (gate, up, down) per expert."""
        return self.experts.bank

    def forward(self, x: torch.Tensor, engine: ExpertEngine, next_gate: Router | None) -> torch.Tensor:
        idx, w = self.gate(x)
        if self.sum_order == "expert_id":  # else the router's top-k order, as the reference sums
            idx, w = sort_by_expert(idx, w)

        def hint(channel: str) -> torch.Tensor:  # the next layer's predicted loads (harness/model/hints.py)
            assert next_gate is not None
            return channel_hint(channel, lambda rows: next_gate.scores(rows).sum(0), x, self.running_mean)

        # the weights stay fp32: a bf16 model weights and sums its experts in fp32, as the reference
        routed = engine.run_experts(
            self.moe_index, x, idx, w, self.expert_weights, hint if next_gate is not None else None
        )
        self.running_mean.update(x)  # after the hint: it reads the rows of earlier forwards only
        return routed.to(x.dtype) + self.shared_experts(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LLaDA2Config, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = Attention(cfg)
        dense = layer_id < cfg.first_k_dense_replace
        self.mlp: nn.Module = (
            DenseMLP(cfg.hidden_size, cfg.intermediate_size)
            if dense
            else MoE(cfg, layer_id - cfg.first_k_dense_replace)
        )


class LLaDA2Model(nn.Module):
    """`LLaDA2MoeModelLM`: parameter names follow the HF checkpoint keys."""

    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        # given a weight, the embedding skips its random init: on the meta device (the loader) that
        # init alone costs seconds (it imports torch's compiler stack); weights come from a checkpoint
        # or `init_weights` anyway
        self.model.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                                  _weight=torch.zeros(cfg.vocab_size, cfg.hidden_size))
        self.model.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.engine: ExpertEngine = LocalExperts()

    def refresh_expert_views(self) -> None:
        """Drop the experts' stacked copies (the batched path's), after their tensors changed in place."""
        for moe in self.moe_layers():
            moe.experts.replace(list(moe.experts))

    def set_expert_sum_order(self, order: str) -> None:
        """The order each token's routed outputs are summed in (docs/model-and-decoding.md "Expert sum order")."""
        if order not in SUM_ORDERS:
            raise HarnessError(f"model.expert_sum_order={order!r} is not allowed; use one of {', '.join(SUM_ORDERS)}")
        for moe in self.moe_layers():
            moe.sum_order = order

    def reset_hint_state(self) -> None:
        """Forget every MoE layer's running mean (harness/model/hints.py): called when the
        model is attached to an engine, so each run's residual hints start alike."""
        for moe in self.moe_layers():
            moe.running_mean.reset()

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, MoE)]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        block_length: int,
        cache: KVCache | None = None,
        commit: bool = False,
    ) -> torch.Tensor:
        """input_ids, positions: [T] (one sequence). With `cache`, the window must start
        where the cache ends and sees every cached position; `commit` appends this
        window's keys/values to the cache. Returns logits [T, vocab] in fp32.

        The decoding loop's tensors live on the host; when the model is placed on a device
        (harness/hybrid) the inputs move in and the logits move out here. On the host every
        `.to` below is a no-op returning the same tensor."""
        cfg = self.config
        device = self.model.word_embeddings.weight.device
        rope = rope_cos_sin(positions, cfg.rotary_dim, cfg.rope_theta)  # on the host, as the positions
        rope = (rope[0].to(device), rope[1].to(device))
        past_len = cache.length if cache is not None else 0
        k_pos = torch.cat((torch.arange(past_len), positions)) if past_len else positions
        mask = block_causal_mask(positions, k_pos, block_length).to(device)
        gates = [m.gate for m in self.moe_layers()] + [None]

        h = self.model.word_embeddings(input_ids.to(device))
        for i, layer in enumerate(self.model.layers):
            past = None
            if cache is not None and past_len:
                past = (cache.keys[i], cache.values[i])
            a, new_kv = layer.attention(layer.input_layernorm(h), rope, mask, past)
            h = h + a
            x = layer.post_attention_layernorm(h)
            if isinstance(layer.mlp, MoE):
                h = h + layer.mlp(x, self.engine, gates[layer.mlp.moe_index + 1])
            else:
                h = h + layer.mlp(x)
            if commit:
                assert cache is not None
                _append_kv(cache, i, new_kv)
        return self.lm_head(self.model.norm(h)).float().to(input_ids.device)


def _append_kv(cache: KVCache, layer: int, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
    while len(cache.keys) <= layer:
        cache.keys.append(None)
        cache.values.append(None)
    k, v = kv
    old_k, old_v = cache.keys[layer], cache.values[layer]
    cache.keys[layer] = k if old_k is None else torch.cat((old_k, k), dim=1)
    cache.values[layer] = v if old_v is None else torch.cat((old_v, v), dim=1)
