"""Loading LLaDA2-MoE checkpoints in the Hugging Face layout.

A checkpoint directory holds config.json, the weights as one `model.safetensors` or as
shards listed by `model.safetensors.index.json`, and tokenizer files. Shards are
memory-mapped and tensors are zero-copy views of the mapping, so a 100 GB checkpoint's
experts are paged in when they are first used, not when the model is built. (When the
requested dtype differs from the stored one, a tensor is converted, which materialises
it.) Every way a checkpoint can be broken gets a one-line `HarnessError`; the checks every
model kind shares (the shards' structure, a NaN or an Inf in any tensor, remembered per
checkpoint identity in the cache) are in harness/model/shards.py; here, the LLaDA2 layout.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from harness.common.errors import HarnessError
from harness.model.config import LLaDA2Config
from harness.model.llada2 import LLaDA2Model
from harness.model.shards import (  # noqa: F401 - re-exported: the shard readers' historical home
    DTYPES,
    INDEX_FILE,
    SINGLE_FILE,
    ShardMaps,
    TensorEntry,
    check_finite,
    index_checkpoint,
    load_tensors,
    read_shard_header,
)
from harness.model.tokenizer import proxy_tokenizer

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")


def check_layers_match(cfg: LLaDA2Config, entries: dict[str, TensorEntry]) -> None:
    layer_ids = {int(m.group(1)) for k in entries if (m := _LAYER_KEY.match(k))}
    if layer_ids and max(layer_ids) + 1 != cfg.num_hidden_layers:
        raise HarnessError(
            f"config.json says num_hidden_layers={cfg.num_hidden_layers} but the weights have "
            f"{max(layer_ids) + 1} layers; the config disagrees with the weights"
        )
    moe_keys = [k for k in entries if ".mlp.experts." in k]
    n_experts = 1 + max((int(k.split(".mlp.experts.")[1].split(".")[0]) for k in moe_keys), default=-1)
    if moe_keys and n_experts != cfg.num_experts:
        raise HarnessError(
            f"config.json says num_experts={cfg.num_experts} but the weights have {n_experts} experts "
            "per layer; the config disagrees with the weights"
        )


def check_no_unexpected(directory: Path, entries: dict[str, TensorEntry], expected: dict) -> None:
    """A tensor the model has no parameter for (a bias, an extra layer) means the checkpoint
    computes something this model does not: refuse it instead of silently dropping it."""
    extra = sorted(set(entries) - set(expected))
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise HarnessError(
            f"checkpoint {directory} has tensor {extra[0]}{more} that this LLaDA2 implementation does not use; "
            "it is not the published LLaDA2-MoE layout (or enables a feature not implemented here)"
        )



def from_pretrained(directory: str | Path, dtype: str = "float32",
                    finite_cache: str | Path | None = None) -> LLaDA2Model:
    """Build the model from a checkpoint directory (real or proxy: same code path). Every
    tensor is checked for NaN and Inf first (once per checkpoint when `finite_cache` is a
    directory that remembers the checks)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise HarnessError(f"model.path={directory} is a file; set it to a LLaDA2 checkpoint directory")
    if not directory.is_dir():
        raise HarnessError(f"checkpoint directory {directory} does not exist; set model.path to a LLaDA2 checkpoint")
    if dtype not in TORCH_DTYPES:
        raise HarnessError(f"model.dtype={dtype!r} is not supported; use one of {', '.join(TORCH_DTYPES)}")
    cfg = LLaDA2Config.from_json(directory / "config.json")
    entries = index_checkpoint(directory)
    check_layers_match(cfg, entries)
    with torch.device("meta"):
        model = LLaDA2Model(cfg)
    maps = ShardMaps()
    check_finite(directory, entries, maps, Path(finite_cache) if finite_cache is not None else None)
    expected = model.state_dict()
    for name, param in expected.items():
        entry = entries.get(name)
        if entry is None:
            raise HarnessError(f"checkpoint {directory} has no tensor {name}; it is incomplete or not LLaDA2-MoE")
        if entry.shape != tuple(param.shape):
            raise HarnessError(
                f"{name} has shape {list(entry.shape)} in the checkpoint but config.json implies "
                f"{list(param.shape)}; the config disagrees with the weights"
            )
    check_no_unexpected(directory, entries, expected)
    # router and norms stay fp32-friendly; everything follows the requested dtype
    state = load_tensors(entries, maps, TORCH_DTYPES[dtype])
    model.load_state_dict(state, assign=True, strict=True)
    model._shard_maps = maps  # keep the mappings alive with the model
    model.eval()
    model.requires_grad_(False)
    return model


def load_tokenizer(directory: str | Path):
    """A proxy's tokenizer without transformers (harness/model/tokenizer.py); else AutoTokenizer's."""
    light = proxy_tokenizer(Path(directory))
    if light is not None:
        return light
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # it reads config.json and warns about the unknown model type
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the tokenizer needs no remote code; never prompt for it
            return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HarnessError(f"cannot load the tokenizer from {directory}: {first}") from None
