"""Tiny models of the transformers families for tests: the proxy configs (harness/families)
shrunk further, built with `from_config` and the proxy initialization, and a router that
records what the bridge hands it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.families.adapter import FamilyAdapter
from harness.families.proxies import new_model, proxy_config
from harness.families.registry import family_adapter

VOCAB = 64
EOS = VOCAB - 1
IDS = {"bos_token_id": EOS, "eos_token_id": EOS, "pad_token_id": EOS}
_ATTN = {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}
TINY: dict[str, dict] = {
    # decoder layer 1 dense: MoE layers 0 and 1 are decoder layers 0 and 2
    "qwen3_moe": {**_ATTN, "num_hidden_layers": 3, "mlp_only_layers": [1], "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 16, "intermediate_size": 64},
    "mixtral": {**_ATTN, "num_hidden_layers": 2, "num_local_experts": 4, "intermediate_size": 16},
    "olmoe": {**_ATTN, "num_key_value_heads": 2, "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2,
              "intermediate_size": 16},
    "diffusiongemma": {"text_config": {
        **_ATTN, "num_hidden_layers": 3, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 16, "intermediate_size": 48,
        "global_head_dim": 32, "num_global_key_value_heads": 1, "sliding_window": 8}},
}
FAMILIES = tuple(TINY)


def tiny_model(name: str, seed: int = 0) -> tuple[FamilyAdapter, torch.nn.Module]:
    adapter = family_adapter(name)
    return adapter, new_model(adapter, proxy_config(name, VOCAB, IDS, TINY[name]), seed)


@dataclass
class RecordingRouter:
    """Records (layer, load, hint or None) per call; asks for every hint."""

    calls: list[tuple[int, torch.Tensor, torch.Tensor | None]] = field(default_factory=list)

    def route(self, layer: int, load: torch.Tensor, hint_fn) -> None:
        self.calls.append((layer, load.clone(), hint_fn("next_gate") if hint_fn is not None else None))


def forward_logits(adapter: FamilyAdapter, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits of one forward: the causal LM over ids, or DiffusionGemma's encoder over the
    first half and its decoder over the second half as a canvas."""
    with torch.no_grad():
        if adapter.kind == "ar":
            return model(input_ids=ids).logits
        from transformers import DynamicCache

        half = ids.shape[1] // 2
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        return model(input_ids=ids[:, :half], decoder_input_ids=ids[:, half:], cache=cache).logits


def published_routing_model(name: str = "olmoe", seed: int = 0) -> tuple[FamilyAdapter, torch.nn.Module]:
    """A model of family `name` with its published routing (layers, experts, top-k) at the
    tiny widths: what `model=<name> model.path=...` accepts (the engine is sized by it)."""
    widths = {k: v for k, v in TINY[name].items()
              if k in (*_ATTN, "intermediate_size", "moe_intermediate_size")}
    adapter = family_adapter(name)
    return adapter, new_model(adapter, proxy_config(name, VOCAB, IDS, widths), seed)
