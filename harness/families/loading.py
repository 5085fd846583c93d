"""Real (or proxy) checkpoints of the transformers families: `from_pretrained` with
safetensors only and no remote code, after checking that the harness serves the
checkpoint's model type and geometry, so a bad checkpoint is one line naming what is
allowed instead of a traceback."""

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
    if not any(path.glob("*.safetensors")):
        raise HarnessError(f"{path} has no *.safetensors weights; the harness loads safetensors only (no pickled "
                           ".bin weights)")
    return adapter, geometry


def load_pretrained(path: str | Path, dtype: str = "float32") -> LoadedFamily:
    """A family checkpoint loaded through transformers' own `from_pretrained`
    (safetensors only, no remote code), checked against its geometry."""
    path = Path(path)
    if dtype not in DTYPES:
        raise HarnessError(f"dtype={dtype!r} is not allowed; use one of {', '.join(DTYPES)}")
    adapter, geometry = check_checkpoint(path)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = adapter.model_cls().from_pretrained(str(path), use_safetensors=True, trust_remote_code=False,
                                                        dtype=DTYPES[dtype])
    except (OSError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HarnessError(f"cannot load the {adapter.name} checkpoint at {path}: {first}") from None
    model.eval()
    adapter.moe_sites(model, geometry)  # every experts module where the geometry says, through the interface
    return LoadedFamily(model, adapter, geometry, path)
