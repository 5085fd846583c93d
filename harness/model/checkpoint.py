"""Loading LLaDA2-MoE checkpoints in the Hugging Face layout.

A checkpoint directory holds config.json, the weights as one `model.safetensors` or as
shards listed by `model.safetensors.index.json`, and tokenizer files. Shards are
memory-mapped and tensors are zero-copy views of the mapping, so a 100 GB checkpoint's
experts are paged in when they are first used, not when the model is built. (When the
requested dtype differs from the stored one, a tensor is converted, which materialises
it.) Every way a checkpoint can be broken gets a one-line `HarnessError`.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.errors import HarnessError
from harness.model.config import LLaDA2Config
from harness.model.llada2 import LLaDA2Model

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class TensorEntry:
    shard: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the shard
    end: int


def read_shard_header(path: Path) -> dict[str, TensorEntry]:
    """Parse a safetensors header: u64 little-endian length, then JSON; checks that the
    file is long enough for every tensor it declares (a truncated download fails here)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HarnessError(f"shard {path} is truncated ({size} bytes); re-download it")
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                raise HarnessError(f"shard {path} is truncated (header needs {8 + n} bytes, file has {size})")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise HarnessError(f"missing shard {path}; the checkpoint is incomplete, re-download it") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HarnessError(f"shard {path} has a corrupt safetensors header; re-download it") from None
    entries = {}
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        begin, end = (8 + n + o for o in meta["data_offsets"])
        if end > size:
            raise HarnessError(f"shard {path} is truncated: {key} ends at byte {end}, file has {size}")
        if meta["dtype"] not in DTYPES:
            raise HarnessError(f"{key} in {path} has unsupported dtype {meta['dtype']}")
        entries[key] = TensorEntry(path, meta["dtype"], tuple(meta["shape"]), begin, end)
    return entries


def index_checkpoint(directory: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint, from the index (sharded) or the single file."""
    index_path = directory / INDEX_FILE
    if index_path.exists():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError):
            raise HarnessError(f"{index_path} is not a valid safetensors index (no weight_map)") from None
        shards = sorted(set(weight_map.values()))
    elif (directory / SINGLE_FILE).exists():
        weight_map, shards = None, [SINGLE_FILE]
    else:
        raise HarnessError(f"no weights in {directory}: expected {SINGLE_FILE} or {INDEX_FILE}")
    entries: dict[str, TensorEntry] = {}
    for shard in shards:
        entries.update(read_shard_header(directory / shard))
    if weight_map is not None:
        for key, shard in weight_map.items():
            if key not in entries:
                raise HarnessError(f"{INDEX_FILE} puts {key} in {shard}, but that shard does not hold it")
    return entries


class ShardMaps:
    """Open memory maps, one per shard, kept alive as long as the tensors viewing them."""

    def __init__(self) -> None:
        self.maps: dict[Path, mmap.mmap] = {}

    def tensor(self, entry: TensorEntry) -> torch.Tensor:
        if entry.shard not in self.maps:
            with entry.shard.open("rb") as f:
                # ACCESS_COPY: writable (torch needs it) yet never written back; pages load lazily
                self.maps[entry.shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        dtype = DTYPES[entry.dtype]
        count = (entry.end - entry.begin) // torch.tensor([], dtype=dtype).element_size()
        if count == 0:
            return torch.empty(entry.shape, dtype=dtype)
        flat = torch.frombuffer(self.maps[entry.shard], dtype=dtype, count=count, offset=entry.begin)
        return flat.view(entry.shape)


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


def from_pretrained(directory: str | Path, dtype: str = "float32") -> LLaDA2Model:
    """Build the model from a checkpoint directory (real or proxy: same code path)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise HarnessError(f"checkpoint directory {directory} does not exist; set model.path to a LLaDA2 checkpoint")
    if dtype not in TORCH_DTYPES:
        raise HarnessError(f"model.dtype={dtype!r} is not supported; use one of {', '.join(TORCH_DTYPES)}")
    cfg = LLaDA2Config.from_json(directory / "config.json")
    entries = index_checkpoint(directory)
    check_layers_match(cfg, entries)
    target = TORCH_DTYPES[dtype]
    with torch.device("meta"):
        model = LLaDA2Model(cfg)
    maps = ShardMaps()
    state = {}
    for name, param in model.state_dict().items():
        entry = entries.get(name)
        if entry is None:
            raise HarnessError(f"checkpoint {directory} has no tensor {name}; it is incomplete or not LLaDA2-MoE")
        if entry.shape != tuple(param.shape):
            raise HarnessError(
                f"{name} has shape {list(entry.shape)} in the checkpoint but config.json implies "
                f"{list(param.shape)}; the config disagrees with the weights"
            )
        t = maps.tensor(entry)
        # router and norms stay fp32-friendly; everything follows the requested dtype
        state[name] = t if t.dtype == target else t.to(target)
    check_no_unexpected(directory, entries, state)
    model.load_state_dict(state, assign=True, strict=True)
    model._shard_maps = maps  # keep the mappings alive with the model
    model.eval()
    model.requires_grad_(False)
    model.refresh_expert_views()
    return model


def load_tokenizer(directory: str | Path):
    import warnings

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
