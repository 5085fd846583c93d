"""DiffusionGemma (google/diffusiongemma-26B-A4B-it): a causal encoder over the prompt and a
bidirectional decoder over a canvas, each with 30 layers that share every weight, each
layer a dense MLP beside 128 routed experts (top-8) behind a `router` with a per-expert
scale. Encoder layer i and decoder layer i are the same MoE layer i for residency.

What differs from the generic adapter: the geometry lives in `text_config`; the router is
`router` (RMSNorm without scale, a learned per-channel scale, then `proj`) and returns
probabilities; every layer is sparse; attention alternates sliding layers (head_dim 256,
8 KV heads, separate V) with full ones (global_head_dim 512, num_global_key_value_heads,
keys reused as values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.families.adapter import FamilyAdapter
from harness.families.geometry import FamilyGeometry, FamilyKind

LAYER_NORMS = 7  # input, post-attention, pre/post feed-forward, post-ff 1 and 2, pre-ff 2


@dataclass(frozen=True)
class DiffusionGemmaAdapter(FamilyAdapter):
    name: str = "diffusiongemma"
    model_types: tuple[str, ...] = ("diffusion_gemma",)
    model_class: str = "DiffusionGemmaForBlockDiffusion"
    kind: FamilyKind = "diffusion"
    router_attr: str = "router"
    router_gives_logits: bool = False

    def text_config(self, raw: dict[str, Any]) -> dict[str, Any]:
        return raw["text_config"]

    def sparse_layers(self, raw: dict[str, Any]) -> tuple[int, ...]:
        return tuple(range(int(self.text_config(raw)["num_hidden_layers"])))

    def geometry(self, name: str, raw: dict[str, Any]) -> FamilyGeometry:
        base = super().geometry(name, raw)
        t = self.text_config(raw)
        h, heads, experts = base.hidden_size, base.num_attention_heads, base.num_experts
        attention = sum(_attention_params(t, layer_type, h, heads) for layer_type in _layer_types(t))
        dense = 3 * h * base.intermediate_size
        return FamilyGeometry(**{
            **{k: getattr(base, k) for k in base.__dataclass_fields__},
            "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
            "attention_params_total": attention,
            "layer_norm_params": LAYER_NORMS * h,
            "router_params": experts * h + h + experts,  # proj, per-channel scale, per-expert scale
            "shared_mlp_params": dense,  # the dense MLP beside the experts, in every layer
            "dense_mlp_params": dense,
            "extra_params": h + dense + h,  # final norm; self-conditioning MLP and its pre-norm
        })

    def router_linear(self, router: nn.Module) -> nn.Module:
        return router.proj

    def forward_batch(self, model: nn.Module, batch: torch.Tensor) -> None:
        """Both stacks: the windows' first half as the prompt, the second as a canvas."""
        half = batch.shape[1] // 2
        model(input_ids=batch[:, :half], decoder_input_ids=batch[:, half:])


def _layer_types(t: dict[str, Any]) -> list[str]:
    n = int(t["num_hidden_layers"])
    types = t.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    return [*types[: n - 1], "full_attention"]  # transformers forces the last layer to full attention


def _attention_params(t: dict[str, Any], layer_type: str, h: int, heads: int) -> int:
    """q, k, (v), o and the q/k norms of one layer; full-attention layers reuse keys as values."""
    if layer_type == "sliding_attention":
        head_dim, kv, v = int(t["head_dim"]), int(t["num_key_value_heads"]), 1
    else:
        head_dim = int(t.get("global_head_dim") or 512)
        kv = int(t.get("num_global_key_value_heads") or t["num_key_value_heads"])
        v = 0
    return h * heads * head_dim * 2 + h * kv * head_dim * (1 + v) + 2 * head_dim


DIFFUSIONGEMMA = DiffusionGemmaAdapter()
