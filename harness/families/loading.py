"""Real (or proxy) checkpoints of the transformers families: `from_pretrained` with
safetensors only and no remote code, after checking that the harness serves the
checkpoint's model type and geometry, so a bad checkpoint is one line naming what is
allowed instead of a traceback. The weights go through the checks every model kind shares
(harness/model/shards.py: every shard's structure, dtypes and offsets, then finite values,
remembered per checkpoint identity) before transformers reads them, and the loaded model must
have taken every tensor with the shape its config gives (docs/bad-input.md)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from harness.common.errors import HarnessError
from harness.families.adapter import FamilyAdapter
from harness.families.geometry import FamilyGeometry
from harness.families.registry import adapter_for_model_type
from harness.model.config import MAX_POSITIONS
from harness.model.shards import ShardMaps, check_finite, index_checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedFamily:
    model: nn.Module
    adapter: FamilyAdapter
    geometry: FamilyGeometry  # the checkpoint's own geometry (a proxy's widths, or the real one)
    path: Path


def read_config(path: Path) -> dict:
    config = path / "config.json"
    try:
        raw = json.loads(config.read_text())
    except FileNotFoundError:
        raise HarnessError(f"missing {config}; model.path must be a Hugging Face checkpoint directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HarnessError(f"{config} is not a JSON config ({exc}); model.path must be a Hugging Face "
                           "checkpoint directory") from None
    if not isinstance(raw, dict):
        raise HarnessError(f"{config} holds a JSON {type(raw).__name__}, not an object; it must be a Hugging Face "
                           "model config")
    return raw


def check_checkpoint(path: Path) -> tuple[FamilyAdapter, FamilyGeometry]:
    """The adapter and geometry of a checkpoint directory, or a HarnessError naming what is
    allowed: its model type must be one the harness has an adapter for, its geometry one
    the bridge can serve, its weights safetensors."""
    raw = read_config(path)
    adapter = adapter_for_model_type(raw.get("model_type"))
    if raw.get("quantization_config") or raw.get("quantization"):
        raise HarnessError(f"{path}/config.json describes a quantized checkpoint; the bridge serves unquantized "
                           "bf16/fp16/fp32 weights only")
    try:
        geometry = adapter.geometry(adapter.name, raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise HarnessError(f"{path}/config.json lacks or mistypes {exc} for a {adapter.name} geometry; it must be "
                           "the config.json the checkpoint was published with") from None
    check_positions(path, adapter.text_config(raw), geometry)
    if not any(path.glob("*.safetensors")):
        raise HarnessError(f"{path} has no *.safetensors weights; the harness loads safetensors only (no pickled "
                           ".bin weights)")
    return adapter, geometry


# the routing fields a checkpoint must share with the geometry it is charged as, with what they count
ROUTING_FIELDS = (("num_experts", "experts per MoE layer"), ("num_experts_per_tok", "experts per token (top-k)"),
                  ("sparse_layers", "MoE decoder layers"))


def check_routing(path: Path, geometry: FamilyGeometry, published: FamilyGeometry) -> None:
    """A checkpoint routes as the geometry it is charged as (its experts, top-k and MoE
    layers), or is refused naming the field: the engine, the budget and the cost model are
    sized by the published geometry, and another expert count used to end in a shape error."""
    for key, what in ROUTING_FIELDS:
        own, nominal = getattr(geometry, key), getattr(published, key)
        if own != nominal:
            shown = (list(own), list(nominal)) if key == "sparse_layers" else (own, nominal)
            raise HarnessError(
                f"model.path={path}: its config.json gives {key}={shown[0]} ({what}) but model={published.name} is "
                f"charged as its published geometry with {key}={shown[1]}; use a checkpoint of that geometry, or add "
                "this one as a family of its own (docs/adding-a-model-family.md)")


def check_weights(path: Path, finite_cache: Path | None) -> None:
    """Every shard's structure (header, dtypes, offsets inside the file: a truncated download
    fails here, not in safetensors) and every tensor finite, before transformers opens them."""
    entries = index_checkpoint(path)
    check_finite(path, entries, ShardMaps(), finite_cache)


def check_positions(path: Path, text: dict, geometry: FamilyGeometry) -> None:
    """What transformers accepts and then decodes garbage with: an odd rotary dimension (RoPE
    rotates pairs of channels) and a position count no model has (a corrupt config)."""
    if not 0 < geometry.max_position_embeddings <= MAX_POSITIONS:
        raise HarnessError(f"{path}/config.json has max_position_embeddings={geometry.max_position_embeddings}; it "
                           f"must be in [1, {MAX_POSITIONS}] (2**24), the checkpoint's config is corrupt")
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    nested = [v for v in rope.values() if isinstance(v, dict)] if isinstance(rope, dict) else []
    factors = {float(c["partial_rotary_factor"]) for c in (text, rope, *nested)
               if isinstance(c, dict) and isinstance(c.get("partial_rotary_factor"), int | float)} or {1.0}
    dims = {geometry.head_dim, *([int(text["global_head_dim"])] if text.get("global_head_dim") else [])}
    for head_dim in sorted(dims):
        for factor in sorted(factors):
            rotary = int(head_dim * factor)
            if rotary % 2 or rotary <= 0:
                raise HarnessError(f"{path}/config.json gives a rotary dimension of {rotary} (head_dim={head_dim} x "
                                   f"partial_rotary_factor={factor}); RoPE rotates pairs, so it must be even and "
                                   "positive")


def load_pretrained(path: str | Path, dtype: str = "float32", finite_cache: str | Path | None = None,
                    published: FamilyGeometry | None = None) -> LoadedFamily:
    """A family checkpoint loaded through transformers' own `from_pretrained`
    (safetensors only, no remote code), checked against its geometry (and against the
    `published` one it is charged as, when given) and its weights checked first; a passed
    finite scan is remembered under `finite_cache`."""
    path = Path(path)
    if dtype not in DTYPES:
        raise HarnessError(f"dtype={dtype!r} is not allowed; use one of {', '.join(DTYPES)}")
    adapter, geometry = check_checkpoint(path)
    if published is not None:
        check_routing(path, geometry, published)
    check_weights(path, Path(finite_cache) if finite_cache is not None else None)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, info = adapter.model_cls().from_pretrained(
                str(path), use_safetensors=True, trust_remote_code=False, dtype=DTYPES[dtype],
                output_loading_info=True, ignore_mismatched_sizes=True)  # refused below, naming the tensor
    except (OSError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HarnessError(f"cannot load the {adapter.name} checkpoint at {path}: {first}") from None
    check_loading_info(path, adapter.name, info)
    model.eval()
    adapter.moe_sites(model, geometry)  # every experts module where the geometry says, through the interface
    return LoadedFamily(model, adapter, geometry, path)


def check_loading_info(path: Path, family: str, info: dict) -> None:
    """transformers fills a parameter the checkpoint lacks (or holds with another shape) with
    random values and drops a tensor it does not know, with a warning at most: refuse both,
    since such a model decodes something other than the checkpoint."""
    for key, what in (("mismatched_keys", "has another shape than its config.json gives"),
                      ("missing_keys", "is missing"), ("unexpected_keys", "is not used by the model")):
        found = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(key) or ())
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise HarnessError(f"the {family} checkpoint at {path}: tensor {found[0]}{more} {what}; the weights "
                               "disagree with config.json, re-download or rebuild the checkpoint")
