"""The nominal (published) geometry of a transformers MoE family: what the budget and the
cost model charge, under the attribute names of the `MoEGeometry` protocol
(harness/placement/system.py), which are LLaDA2Config's.

A family's geometry is derived from its published config.json (stored, with its source,
in harness/families/configs/<name>.json) by the family's adapter, which counts the
parameters of the modules transformers builds for that config; tests/test_families.py
checks every count against the model transformers builds on the meta device.

Attribute names follow LLaDA2Config, with these meanings where the families differ:

  first_k_dense_replace  the number of dense (non-MoE) decoder layers, wherever they sit
                         (Qwen3-MoE's mlp_only_layers need not be the first ones); the cost
                         model charges dense layers by count
  num_shared_experts     the always-on MLP of every MoE layer (shared experts, or
                         DiffusionGemma's dense MLP beside its experts) in units of one routed
                         expert: shared_mlp_params / expert_params (a float when it is not a
                         whole number of experts; DiffusionGemma's is exactly 3.0)
  attention_params       attention parameters per layer, the mean over layers (DiffusionGemma's
                         full-attention layers are wider than its sliding ones)
  num_key_value_heads,   the common (sliding-window, for DiffusionGemma) layers' values; the
  head_dim               KV-cache size the cost model charges

Extra fields: sparse_layers (which decoder layers are MoE), kind ("ar" or "diffusion"),
layer_norm_params, router_params, shared_mlp_params, dense_mlp_params, extra_params (the
per-layer and model-level parameter counts the totals are built from).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from harness.common.errors import HarnessError
from harness.model.config import ParamTotals

CONFIG_DIR = Path(__file__).parent / "configs"
FamilyKind = Literal["ar", "diffusion"]


@dataclass(frozen=True)
class FamilyGeometry(ParamTotals):
    name: str
    model_type: str
    kind: FamilyKind
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    sparse_layers: tuple[int, ...]  # decoder layers with routed experts, ascending
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    intermediate_size: int  # the dense MLP's width (dense layers, or beside the experts)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    # parameter counts the adapter derives from the config (see the module docstring)
    attention_params_total: int  # all layers' attention, QK norms included
    layer_norm_params: int  # per decoder layer, outside attention
    router_params: int  # per MoE layer
    shared_mlp_params: int  # per MoE layer: the MLP every token passes besides its routed experts
    dense_mlp_params: int  # per dense layer
    extra_params: int = 0  # model-level: the final norm and anything else outside the layers

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok",
                    "moe_intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
        for key in positive:
            if getattr(self, key) <= 0:
                raise HarnessError(f"{self.name}: {key}={getattr(self, key)} must be positive")
        if not self.sparse_layers:
            raise HarnessError(f"{self.name}: no decoder layer has routed experts; the bridge serves MoE models only")
        if list(self.sparse_layers) != sorted(set(self.sparse_layers)) or self.sparse_layers[0] < 0 \
                or self.sparse_layers[-1] >= self.num_hidden_layers:
            raise HarnessError(f"{self.name}: sparse layers {list(self.sparse_layers)} must be distinct, "
                               f"ascending decoder layers below {self.num_hidden_layers}")
        if self.num_experts_per_tok > self.num_experts:
            raise HarnessError(f"{self.name}: top-k {self.num_experts_per_tok} exceeds the {self.num_experts} experts")

    # ---- the attributes the cost model and the budget read (MoEGeometry's, LLaDA2Config's names) ----
    @property
    def n_moe_layers(self) -> int:
        return len(self.sparse_layers)

    @property
    def first_k_dense_replace(self) -> int:
        return self.num_hidden_layers - self.n_moe_layers

    @property
    def expert_params(self) -> int:
        """One routed expert: gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def num_shared_experts(self) -> int | float:
        whole, rest = divmod(self.shared_mlp_params, self.expert_params)
        return whole if rest == 0 else self.shared_mlp_params / self.expert_params

    @property
    def attention_params(self) -> int:
        return self.attention_params_total // self.num_hidden_layers

    @property
    def non_expert_params(self) -> int:
        h = self.hidden_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return (
            embed
            + self.extra_params
            + self.attention_params_total
            + self.num_hidden_layers * self.layer_norm_params
            + self.first_k_dense_replace * self.dense_mlp_params
            + self.n_moe_layers * (self.router_params + self.shared_mlp_params)
        )

    def moe_index(self, decoder_layer: int) -> int:
        """The MoE-layer index (dense layers not counted) of a sparse decoder layer."""
        try:
            return self.sparse_layers.index(decoder_layer)
        except ValueError:
            raise HarnessError(f"{self.name}: decoder layer {decoder_layer} has no routed experts "
                               f"(sparse layers: {list(self.sparse_layers)})") from None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["sparse_layers"] = list(self.sparse_layers)
        for key in ("n_moe_layers", "expert_params", "non_expert_params", "total_params", "active_params"):
            out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FamilyGeometry:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        values["sparse_layers"] = tuple(values.get("sparse_layers", ()))
        return cls(**values)


def family_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def read_family_json(name: str) -> dict[str, Any]:
    """A family's stored config: `_source`, `adapter`, the published `config` and `proxy` widths."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.exists():
        raise HarnessError(f"unknown model family {name!r}; choose one of {', '.join(family_names())}")
    return json.loads(path.read_text())
