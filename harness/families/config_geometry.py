"""Any MoE model's geometry from its config.json alone (no weights): what the budget and the
cost model charge a model that replays imported routing traces (harness/zoo/config_only.py,
docs/real-routing.md).

transformers' `AutoConfig` reads the file (it knows every family's key names: `num_experts`,
`num_local_experts`, `n_routed_experts`, `moe_layers`, `first_k_dense_replace`,
`mlp_only_layers`, ...), and the model transformers builds for that config on the meta
device (no memory, ~2 s for DeepSeek-V3) is counted module by module, so first-k-dense,
interleaved and every-layer MoE, shared experts, expert biases, MLA or grouped-query
attention all come out as the model really has them:

  sparse layers      the decoder layers holding a module named `experts`
  routed expert      the parameters under `experts` / the number of experts (biases included)
  router             the MoE block's `gate` or `router` (bias and score-correction included)
  shared MLP         the rest of the MoE block (shared experts, their gate), per MoE layer
  attention          each layer's child named *attn* / *attention*
  norms              each layer's remaining children (per layer; the final norm is model-level)
  dense MLP          a dense layer's rest
  embeddings         the input and output embeddings (once when tied)

Per-layer counts that differ between layers keep their total exact by moving the remainder
into `extra_params`. A multimodal config is counted by its text decoder (the routed part).

For the cost model's key/value bytes, grouped-query attention is charged by its own heads;
multi-head latent attention (a config with `kv_lora_rank`) caches one latent of
kv_lora_rank + qk_rope_head_dim values per token, charged as one KV head of half that
width (the bytes exact; docs/real-routing.md). Weights are charged at bf16 whatever the
checkpoint's dtype or quantization (docs/cost-model.md); both are recorded.

Refused in one line: a file that is not a JSON object, a model type transformers does not
know, a model that transformers cannot build as a causal LM, and a dense model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.common.errors import HarnessError
from harness.families.geometry import FamilyGeometry

PUBLISHED_DIR = Path(__file__).parent / "published"
# keys that describe the files or the weights' storage, not the geometry
NOT_GEOMETRY = ("model_type", "architectures", "auto_map", "quantization_config", "transformers_version",
                "_name_or_path")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k", "top_k")
MAX_DROPPED = 8  # fields transformers' validation refuses that the reader may leave to their defaults
_FIELD = re.compile(r"field '([^']+)'")


@dataclass(frozen=True)
class ConfigGeometry(FamilyGeometry):
    """A FamilyGeometry counted from the model transformers builds for a config.json."""

    routed_expert_params: int = 0  # one routed expert, biases included (FamilyGeometry's 3 H I has none)
    dtype: str = "bfloat16"  # the config's torch_dtype (the cost model charges bf16 regardless)
    quantization: str = "none"  # the config's quantization method (fp8, mxfp4, ...): charged as bf16
    source: str = ""  # where the config was read
    dropped_keys: tuple[str, ...] = ()  # keys transformers refused (type checks), left at its defaults

    @property
    def expert_params(self) -> int:
        return self.routed_expert_params

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["dropped_keys"] = list(self.dropped_keys)
        return out


def read_config_file(path: Path) -> tuple[dict[str, Any], Path]:
    """The JSON object of a config.json, given as the file or the directory holding it."""
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text())
    except FileNotFoundError:
        raise HarnessError(f"no config.json at {path}: give the model's config.json or the directory holding it "
                           "(model.path=<file or directory>)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise HarnessError(f"{file} is not a JSON config ({' '.join(str(exc).split())[:120]}); give the model's "
                           "config.json as published") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise HarnessError(f"{file} is not a Hugging Face model config (a JSON object with a model_type); give the "
                           "model's config.json as published")
    return raw, file


def config_geometry(path: str | Path, name: str = "hf") -> ConfigGeometry:
    """The geometry of the config.json at `path` (the file or its directory), cached by the
    file's bytes."""
    raw, file = read_config_file(Path(path))
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()
    return _cached(name, str(file), digest, json.dumps(raw))


def published_names() -> list[str]:
    return sorted(p.stem for p in PUBLISHED_DIR.glob("*.json"))


def read_published(name: str) -> dict[str, Any]:
    """A stored published config: `_source` (where its values were read, the published
    parameter counts) and `config` (the config.json's values)."""
    path = PUBLISHED_DIR / f"{name}.json"
    if not path.exists():
        raise HarnessError(f"no published config {name!r}; the stored ones are {', '.join(published_names())}")
    return json.loads(path.read_text())


def published_geometry(name: str) -> ConfigGeometry:
    raw = read_published(name)["config"]
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()
    return _cached(name, str(PUBLISHED_DIR / f"{name}.json"), digest, json.dumps(raw))


@lru_cache(maxsize=32)
def _cached(name: str, source: str, digest: str, text: str) -> ConfigGeometry:
    return geometry_of_config(name, json.loads(text), source)


def geometry_of_config(name: str, raw: dict[str, Any], source: str = "") -> ConfigGeometry:
    """Count the model transformers builds for `raw` (module docstring)."""
    hf_config, dropped = hf_config_of(raw, source)
    text = hf_config.get_text_config(decoder=True)
    experts = _pick(text, EXPERT_KEYS)
    top_k = _pick(text, TOP_K_KEYS)
    if not experts or experts <= 1:
        raise HarnessError(f"{source or name} describes a dense model (model_type={raw['model_type']}: no "
                           f"{' / '.join(EXPERT_KEYS)}); only a mixture-of-experts model has experts to offload")
    if not top_k:
        raise HarnessError(f"{source or name} has {experts} experts but no top-k ({' / '.join(TOP_K_KEYS)}); give "
                           "the config.json as published")
    model = _build(text, raw["model_type"], source or name)
    counts = _count(model, text, experts, source or name)
    return _geometry(name, raw, text, counts, experts, top_k, source, dropped)


def hf_config_of(raw: dict[str, Any], source: str = "") -> tuple[Any, tuple[str, ...]]:
    """transformers' config object for a config.json's values; fields its type checks refuse
    (published Llama-4 configs write attn_temperature_tuning=4 where transformers now wants a
    bool) are left to their defaults and named, at most MAX_DROPPED of them."""
    from transformers import AutoConfig

    values = copy.deepcopy({k: v for k, v in raw.items() if k not in NOT_GEOMETRY})
    dropped: list[str] = []
    while True:
        try:
            return AutoConfig.for_model(raw["model_type"], **values), tuple(dropped)
        except ValueError as exc:  # an unknown model type
            if "Unrecognized" in str(exc) or "model_type" in str(exc):
                raise HarnessError(_unknown(raw["model_type"], source)) from None
            raise HarnessError(f"{source}: transformers refuses this config ({' '.join(str(exc).split())[:160]}); "
                               "give the config.json as published") from None
        except Exception as exc:  # huggingface_hub's strict dataclass validation of one field
            field = _FIELD.search(str(exc))
            if field is None or len(dropped) >= MAX_DROPPED or not _drop(values, field.group(1)):
                raise HarnessError(f"{source}: transformers refuses this config ({' '.join(str(exc).split())[:160]}); "
                                   "give the config.json as published") from None
            dropped.append(field.group(1))


def _unknown(model_type: str, source: str) -> str:
    import transformers

    return (f"{source}: transformers {transformers.__version__} does not know model_type={model_type!r}; upgrade "
            "transformers, or give the config.json of a model transformers implements (remote code is never run)")


def _drop(values: dict[str, Any], key: str) -> bool:
    """Remove `key` wherever it sits (top level or a sub-config); whether it was there."""
    found = values.pop(key, None) is not None or key in values
    for sub in values.values():
        if isinstance(sub, dict):
            found = _drop(sub, key) or found
    return found


def _pick(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _build(text_config: Any, model_type: str, source: str) -> nn.Module:
    """The causal LM transformers builds for the text config, on the meta device."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(text_config)
    except ValueError as exc:
        raise HarnessError(f"{source}: transformers cannot build model_type={model_type} as a causal language model "
                           f"({' '.join(str(exc).split())[:120]}); its routing cannot be replayed here") from None


@dataclass
class _Counts:
    sparse: list[int]
    expert: int
    router: list[int]
    shared: list[int]
    dense: list[int]
    attention: int
    norms: list[int]
    embeddings: int
    total: int
    tied: bool


def _count(model: nn.Module, text: Any, experts: int, source: str) -> _Counts:
    layers = _decoder_layers(model, int(text.num_hidden_layers), source)
    sparse, router, shared, dense, norms = [], [], [], [], []
    expert, attention = 0, 0
    for i, layer in enumerate(layers):
        block, experts_module = _moe_block(layer)
        attn = sum(_size(m) for n, m in layer.named_children() if "attn" in n or "attention" in n)
        attention += attn
        if block is None:
            mlp = sum(_size(m) for n, m in layer.named_children() if not _is_norm(m) and not _is_attention(n))
            dense.append(mlp)
            norms.append(_size(layer) - attn - mlp)
            continue
        sparse.append(i)
        in_experts = _size(experts_module)
        if in_experts % experts:
            raise HarnessError(f"{source}: layer {i}'s experts hold {in_experts} parameters, not a multiple of its "
                               f"{experts} experts; the config and the model transformers builds disagree")
        expert = expert or in_experts // experts
        gate = sum(_size(m) for n, m in block.named_children() if n in ("gate", "router"))
        router.append(gate)
        shared.append(_size(block) - in_experts - gate)
        norms.append(_size(layer) - attn - _size(block))
    if not sparse:
        raise HarnessError(f"{source} names {experts} experts but no layer of the model transformers builds has an "
                           "`experts` module; a dense model has nothing to offload")
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    tied = outputs is not None and outputs.weight is inputs.weight
    embeddings = _size(inputs) + (0 if tied or outputs is None else _size(outputs))
    return _Counts(sparse, expert, router, shared, dense, attention, norms, embeddings, _size(model), tied)


def _decoder_layers(model: nn.Module, n_layers: int, source: str) -> nn.ModuleList:
    for name, module in model.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return module
    raise HarnessError(f"{source}: the model transformers builds has no list of {n_layers} decoder layers")


def _moe_block(layer: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """(the MoE block, its `experts` module) of a decoder layer, or (None, None)."""
    modules = dict(layer.named_modules())
    for name, module in modules.items():
        if name.split(".")[-1] == "experts":
            parent = modules.get(name.rpartition(".")[0]) if "." in name else layer
            return parent, module
    return None, None


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def _is_attention(name: str) -> bool:
    return "attn" in name or "attention" in name


def _size(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _uniform(values: list[int]) -> tuple[int, int]:
    """(per-layer value, remainder): the smallest, and what the others add beyond it."""
    if not values:
        return 0, 0
    low = min(values)
    return low, sum(values) - low * len(values)


def _geometry(name: str, raw: dict[str, Any], text: Any, c: _Counts, experts: int, top_k: int, source: str,
              dropped: tuple[str, ...]) -> ConfigGeometry:
    h, n_layers = int(text.hidden_size), int(text.num_hidden_layers)
    heads = int(text.num_attention_heads)
    router, router_rest = _uniform(c.router)
    shared, shared_rest = _uniform(c.shared)
    dense, dense_rest = _uniform(c.dense)
    norms, norms_rest = _uniform(c.norms)
    layers = sum(c.router) + sum(c.shared) + sum(c.dense) + sum(c.norms) + c.attention \
        + c.expert * experts * len(c.sparse)
    extra = c.total - layers - c.embeddings + router_rest + shared_rest + dense_rest + norms_rest
    width = getattr(text, "moe_intermediate_size", None) or int(text.intermediate_size)
    kv_lora = getattr(text, "kv_lora_rank", None)
    if kv_lora:  # multi-head latent attention: one cached latent per token (module docstring)
        kv_heads, head_dim = 1, math.ceil((int(kv_lora) + int(getattr(text, "qk_rope_head_dim", 0) or 0)) / 2)
    else:
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or h // heads)
    dense_width = round(dense / (3 * h)) if c.dense else int(getattr(text, "intermediate_size_mlp", None)
                                                             or text.intermediate_size)
    quant = raw.get("quantization_config") or {}
    dtype = getattr(text, "dtype", None) or raw.get("torch_dtype") or "bfloat16"
    vocab = int(text.vocab_size)
    # ParamTotals charges the embeddings as vocab x hidden (twice untied): any difference is extra
    extra += c.embeddings - vocab * h * (1 if c.tied else 2)
    return ConfigGeometry(
        name=name, model_type=str(raw["model_type"]), kind="ar", vocab_size=vocab, hidden_size=h,
        num_hidden_layers=n_layers, sparse_layers=tuple(c.sparse), num_experts=experts, num_experts_per_tok=top_k,
        moe_intermediate_size=int(width), intermediate_size=int(dense_width), num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, tie_word_embeddings=c.tied,
        max_position_embeddings=int(getattr(text, "max_position_embeddings", None) or 4096),
        attention_params_total=c.attention, layer_norm_params=norms, router_params=router,
        shared_mlp_params=shared, dense_mlp_params=dense, extra_params=extra,
        routed_expert_params=c.expert, dtype=str(dtype).removeprefix("torch."),
        quantization=str(quant.get("quant_method", "none")) if isinstance(quant, dict) else "none",
        source=source, dropped_keys=dropped,
    )
