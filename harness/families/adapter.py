"""What the bridge needs to know about one transformers MoE family, and the generic answer
for decoder-only models whose MoE block is `mlp` with a `gate` router and an `experts`
module (Mixtral, Qwen3-MoE, OLMoE and most of transformers' MoE families).

An adapter says: which HF model types it serves and with which model class; which decoder
layers are sparse; how to find each experts module's MoE-layer index and its router; how
to turn a router's output into routing probabilities (the next-layer hint); how to count
the published geometry's parameters; and which config keys a proxy shrinks.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from harness.common.errors import HarnessError
from harness.families.geometry import FamilyGeometry, FamilyKind

QKNorm = Literal["none", "head", "full"]
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class MoESite:
    """One experts module: its MoE-layer index, the decoder stack it sits in (encoder and
    decoder stacks of one model share MoE-layer indices), and its router."""

    layer: int
    stack: str
    experts: nn.Module
    router: nn.Module


def uses_experts_interface(module: nn.Module) -> bool:
    """An experts module whose class `use_experts_implementation` decorated: its forward
    dispatches on `config._experts_implementation` and keeps the eager one as __wrapped__."""
    forward = getattr(type(module), "forward", None)
    return hasattr(forward, "__wrapped__") and hasattr(module, "gate_up_proj") and hasattr(module, "config")


def eager_forward(module: nn.Module):
    """The experts class's own (eager) forward, whatever implementation is configured."""
    return type(module).forward.__wrapped__


@dataclass(frozen=True)
class FamilyAdapter:
    """The generic decoder-only adapter; a family that differs subclasses it (see
    diffusiongemma.py) or, when only key names differ, just configures it."""

    name: str
    model_types: tuple[str, ...]
    model_class: str = "AutoModelForCausalLM"  # a transformers attribute, resolved on use
    kind: FamilyKind = "ar"
    router_attr: str = "gate"  # the router's attribute name beside `experts`
    router_gives_logits: bool = True  # the router forward's first output: logits (else probabilities)
    qk_norm: QKNorm = "none"  # "head": q/k RMSNorm over head_dim; "full": over the whole projection
    # config keys, first present wins (transformers writes the attribute_map's other name)
    num_experts_keys: tuple[str, ...] = ("num_experts", "num_local_experts", "n_routed_experts")
    top_k_keys: tuple[str, ...] = ("num_experts_per_tok", "top_k_experts")
    expert_width_key: str = "moe_intermediate_size"
    # keys whose proxy value follows the tokenizer (the LLaDA2 proxies' stdlib tokenizer)
    token_keys: tuple[str, ...] = ("bos_token_id", "eos_token_id", "pad_token_id")
    notes: dict[str, str] = field(default_factory=dict)

    # ---- the published config -------------------------------------------------------
    def text_config(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The part of config.json that holds the decoder geometry."""
        return raw

    def sparse_layers(self, raw: dict[str, Any]) -> tuple[int, ...]:
        """Decoder layers with routed experts: Qwen-MoE's rule (not in mlp_only_layers and
        (i + 1) % decoder_sparse_step == 0) and DeepSeek's (i >= first_k_dense_replace);
        a config without those keys is sparse everywhere."""
        text = self.text_config(raw)
        dense = set(text.get("mlp_only_layers") or [])
        step = int(text.get("decoder_sparse_step") or 1)
        first = int(text.get("first_k_dense_replace") or 0)
        n = int(text["num_hidden_layers"])
        return tuple(i for i in range(n) if i not in dense and (i + 1) % step == 0 and i >= first)

    def geometry(self, name: str, raw: dict[str, Any]) -> FamilyGeometry:
        t = self.text_config(raw)
        h, heads, kv = int(t["hidden_size"]), int(t["num_attention_heads"]), int(t["num_key_value_heads"])
        head_dim = int(t.get("head_dim") or h // heads)
        width = int(t[self.expert_width_key])
        experts = int(_pick(t, self.num_experts_keys))
        proj = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o; k, v
        bias = (heads * head_dim + 2 * kv * head_dim + h) if t.get("attention_bias") else 0
        qk = {"none": 0, "head": 2 * head_dim, "full": (heads + kv) * head_dim}[self.qk_norm]
        n_layers = int(t["num_hidden_layers"])
        return FamilyGeometry(
            name=name, model_type=raw["model_type"], kind=self.kind, vocab_size=int(t["vocab_size"]),
            hidden_size=h, num_hidden_layers=n_layers, sparse_layers=self.sparse_layers(raw),
            num_experts=experts, num_experts_per_tok=int(_pick(t, self.top_k_keys)), moe_intermediate_size=width,
            intermediate_size=int(t["intermediate_size"]), num_attention_heads=heads, num_key_value_heads=kv,
            head_dim=head_dim, tie_word_embeddings=bool(t.get("tie_word_embeddings", False)),
            max_position_embeddings=int(t.get("max_position_embeddings", 4096)),
            attention_params_total=n_layers * (proj + bias + qk), layer_norm_params=2 * h,
            router_params=experts * h, shared_mlp_params=0, dense_mlp_params=3 * h * int(t["intermediate_size"]),
            extra_params=h,  # the final norm
        )

    def proxy_config(self, family_json: dict[str, Any], vocab_size: int, token_ids: dict[str, int]) -> dict[str, Any]:
        """The published config (family_json["config"]) at the proxy's widths (its `proxy`
        overrides merged in) with the proxy tokenizer's vocabulary and special ids; layers,
        sparse layers, experts and top-k stay the published ones."""
        out = copy.deepcopy(family_json["config"])
        _merge(out, family_json.get("proxy", {}))
        text = self.text_config(out)
        text["vocab_size"] = vocab_size
        for key in self.token_keys:
            text[key] = token_ids[key]
            if text is not out and key in out:
                out[key] = token_ids[key]
        return out

    # ---- transformers objects -----------------------------------------------------------
    def model_cls(self) -> type:
        import transformers

        cls = getattr(transformers, self.model_class, None)
        if cls is None or not _has_experts_interface():
            raise HarnessError(f"model={self.name} needs transformers' {self.model_class} and its experts interface "
                               f"(transformers.integrations.moe); transformers {transformers.__version__} has not got "
                               "them: pip install -U 'transformers>=5.24'")
        return cls

    def hf_config(self, raw_config: dict[str, Any]):
        from transformers import AutoConfig

        values = {k: v for k, v in raw_config.items() if k not in ("model_type", "architectures")}
        return AutoConfig.for_model(raw_config["model_type"], **values)

    def from_config(self, hf_config, dtype: torch.dtype = torch.float32) -> nn.Module:
        """A model with transformers' own initialization (Auto classes build through
        `from_config`; a concrete class through the `_from_config` they call)."""
        cls = self.model_cls()
        build = getattr(cls, "from_config", None) or cls._from_config
        return build(hf_config, dtype=dtype)

    # ---- the modules the bridge hooks -----------------------------------------------------
    def decoder_layer_of(self, module_name: str) -> tuple[str, int] | None:
        """(stack, decoder layer) of a module named `<stack>layers.<i>.<...>`."""
        match = _LAYER.search(module_name)
        if match is None:
            return None
        return module_name[: match.start()], int(match.group(1))

    def moe_sites(self, model: nn.Module, geometry: FamilyGeometry) -> list[MoESite]:
        """Every experts module with its MoE-layer index, in model order; an experts module
        that does not dispatch through the experts interface, one without its router, or
        layers that disagree with the geometry's sparse layers are a HarnessError."""
        sites: list[MoESite] = []
        modules = dict(model.named_modules())
        for name, module in modules.items():
            if not (hasattr(module, "gate_up_proj") and name.endswith("experts")):
                continue
            if not uses_experts_interface(module):
                raise HarnessError(f"{self.name}: {name} ({type(module).__name__}) does not dispatch through "
                                   "transformers' experts interface; the bridge cannot serve it")
            where = self.decoder_layer_of(name)
            parent = modules.get(name.rpartition(".")[0])
            router = getattr(parent, self.router_attr, None) if parent is not None else None
            if where is None or router is None:
                raise HarnessError(f"{self.name}: cannot place {name}: no decoder layer index or no "
                                   f"`{self.router_attr}` router beside it; the bridge cannot serve this model")
            stack, layer = where
            sites.append(MoESite(geometry.moe_index(layer), stack, module, router))
        check_sites(self.name, sites, geometry)
        return sites

    def router_probs(self, router: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Routing probabilities [T, E] (fp32) of `router` on hidden states x, without its
        hooks (so nothing records this extra call)."""
        out = type(router).forward(router, x.reshape(-1, x.shape[-1]))[0]
        return torch.softmax(out.float(), dim=-1) if self.router_gives_logits else out.float()

    def router_linear(self, router: nn.Module) -> nn.Module:
        """The module whose input the routing matrix multiplies and which holds it as
        `.weight` [E, H] (the proxy's balancing hooks it)."""
        return router

    def forward_batch(self, model: nn.Module, batch: torch.Tensor) -> None:
        """One forward that routes a [windows, length] batch of token ids through every MoE
        layer (the proxy's balancing): the causal LM over the windows."""
        model(input_ids=batch)


def check_sites(name: str, sites: list[MoESite], geometry: FamilyGeometry) -> None:
    """Each stack has exactly the geometry's MoE layers, each once."""
    stacks: dict[str, list[int]] = {}
    for site in sites:
        stacks.setdefault(site.stack, []).append(site.layer)
    want = list(range(geometry.n_moe_layers))
    if not stacks or any(sorted(layers) != want for layers in stacks.values()):
        found = {stack or "model": sorted(layers) for stack, layers in stacks.items()}
        raise HarnessError(f"{name}: the model's experts modules sit at MoE layers {found}, but the geometry has "
                           f"{geometry.n_moe_layers} (decoder layers {list(geometry.sparse_layers)}); the bridge "
                           "cannot serve a model whose experts disagree with its config")


def _pick(config: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    raise KeyError(" or ".join(keys))


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def _has_experts_interface() -> bool:
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS  # noqa: F401
    except ImportError:
        return False
    return True
