"""Safetensors checkpoints, whatever model they hold: the structural checks of every shard
(header, dtypes, offsets inside the file spanning exactly shape x item size, no overlaps),
the index, zero-copy memory maps, runs of adjacent tensors, and the finite-weight scan
remembered per checkpoint identity. Every model kind goes through these before any decode
(LLaDA2 in harness/model/checkpoint.py, the transformers families in
harness/families/loading.py); docs/bad-input.md lists the refusals.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.common.errors import HarnessError
from harness.common.files import write_json_atomic
from harness.common.paths import check_no_special_files, file_kind, require_regular_file

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}

@dataclass(frozen=True)
class TensorEntry:
    shard: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the shard
    end: int


MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header
ITEM_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}


def read_shard_header(path: Path) -> dict[str, TensorEntry]:
    """Parse a safetensors header: u64 little-endian length, then a JSON object of
    {name: {dtype, shape, data_offsets}}. Every entry is checked against the file: the
    dtype is one the harness reads, the offsets are inside the file and span exactly
    shape x item size bytes (a truncated download or a hand-edited header fails here)."""
    header, data_start, size = _read_header_json(path)
    if not isinstance(header, dict):
        raise HarnessError(f"shard {path} has a safetensors header that is a JSON {type(header).__name__}, "
                           "not an object; re-download it")
    entries = {}
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        entries[key] = _tensor_entry(path, key, meta, data_start, size)
    check_no_overlap(path, entries)
    return entries


def check_no_overlap(path: Path, entries: dict[str, TensorEntry]) -> None:
    """No two tensors share bytes: overlapping offsets load (each view reads the other's
    bytes), so a hand-edited or corrupt header would silently alias weights."""
    spans = sorted((e.begin, e.end, key) for key, e in entries.items() if e.end > e.begin)
    for (_, end, first), (begin, _, second) in itertools.pairwise(spans):
        if begin < end:
            raise HarnessError(f"shard {path} is corrupt: the data_offsets of {second} overlap those of {first}; "
                               "re-download it")


def _read_header_json(path: Path) -> tuple[object, int, int]:
    """(parsed header, first data byte, file size); one-line errors for a short or unreadable file."""
    kind = file_kind(path)
    if kind == "a directory":
        raise HarnessError(f"shard {path} is a directory, not a safetensors file")
    if kind not in ("file", "missing"):  # a FIFO blocks open() forever
        require_regular_file(path, f"shard {path}", "the checkpoint is incomplete, re-download it")
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HarnessError(f"shard {path} is truncated ({size} bytes); re-download it")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise HarnessError(f"shard {path} declares a {n}-byte header (the limit is {MAX_HEADER_BYTES}); "
                                   "it is corrupt or not a safetensors file")
            if 8 + n > size:
                raise HarnessError(f"shard {path} is truncated (header needs {8 + n} bytes, file has {size})")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise HarnessError(f"missing shard {path}; the checkpoint is incomplete, re-download it") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise HarnessError(f"shard {path} has a corrupt safetensors header; re-download it") from None
    except OSError as exc:
        raise HarnessError(f"cannot read shard {path} ({exc.strerror or exc})") from None
    return header, 8 + n, size


def _tensor_entry(path: Path, key: str, meta: object, data_start: int, size: int) -> TensorEntry:
    where = f"{key} in {path}"
    if not isinstance(meta, dict):
        raise HarnessError(f"{where}: the header entry is not an object with dtype, shape and data_offsets")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in meta]
    if missing:
        raise HarnessError(f"{where}: the header entry has no {', '.join(missing)}; the shard is corrupt")
    dtype, shape, offsets = meta["dtype"], meta["shape"], meta["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise HarnessError(f"{where} has unsupported dtype {dtype!r}; the harness reads {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise HarnessError(f"{where} has shape {shape!r}; a shape is a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise HarnessError(f"{where} has data_offsets {offsets!r}; they must be [begin, end] with 0 <= begin <= end")
    begin, end = (data_start + o for o in offsets)
    if end > size:
        raise HarnessError(f"shard {path} is truncated: {key} ends at byte {end}, file has {size}")
    need = ITEM_SIZE[dtype] * math.prod(shape)
    if end - begin != need:
        raise HarnessError(f"{where} spans {end - begin} bytes but shape {shape} of {dtype} needs {need}; "
                           "the shard is corrupt")
    return TensorEntry(path, dtype, tuple(shape), begin, end)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def index_checkpoint(directory: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint, from the index (sharded) or the single file."""
    check_no_special_files(directory, f"checkpoint {directory}")
    index_path = directory / INDEX_FILE
    if index_path.exists():
        weight_map = read_weight_map(index_path)
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


def read_weight_map(index_path: Path) -> dict[str, str]:
    """The index's {tensor name: shard file}; every shard a plain file name in the directory."""
    require_regular_file(index_path, str(index_path), "the checkpoint's index must be a JSON file")
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, IsADirectoryError, RecursionError):
        raise HarnessError(f"{index_path} is not a valid safetensors index (no weight_map)") from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise HarnessError(f"{index_path}: weight_map must map tensor names to shard file names")
    for shard in set(weight_map.values()):
        if not shard or Path(shard).name != shard or shard in (".", ".."):
            raise HarnessError(f"{index_path} names shard {shard!r}; shards must be file names inside the checkpoint")
    return weight_map


class ShardMaps:
    """Open memory maps, one per shard, kept alive as long as the tensors viewing them."""

    def __init__(self) -> None:
        self.maps: dict[Path, mmap.mmap] = {}
        self._runs: tuple[dict[str, TensorEntry], list[TensorRun]] | None = None

    def runs(self, entries: dict[str, TensorEntry]) -> list[TensorRun]:
        """`tensor_runs(entries)`, computed once for the entries these maps serve (the finite
        scan and the load both walk them)."""
        if self._runs is None or self._runs[0] is not entries:
            self._runs = (entries, tensor_runs(entries))
        return self._runs[1]

    def flat(self, shard: Path, dtype: str, begin: int, end: int) -> torch.Tensor:
        """bytes [begin, end) of a shard as a 1-D tensor of `dtype`, a zero-copy view of its mapping."""
        if shard not in self.maps:
            with shard.open("rb") as f:
                # ACCESS_COPY: writable (torch needs it) yet never written back; pages load lazily
                self.maps[shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        count = (end - begin) // ITEM_SIZE[dtype]
        if count == 0:
            return torch.empty(0, dtype=DTYPES[dtype])
        return torch.frombuffer(self.maps[shard], dtype=DTYPES[dtype], count=count, offset=begin)

    def tensor(self, entry: TensorEntry) -> torch.Tensor:
        return self.flat(entry.shard, entry.dtype, entry.begin, entry.end).view(entry.shape)


@dataclass(frozen=True)
class TensorRun:
    """Tensors stored back to back in one shard with one dtype: read, checked and converted
    as one span, so per-tensor work is only a view (a checkpoint has ~15k tensors)."""

    shard: Path
    dtype: str
    begin: int
    end: int
    names: tuple[str, ...]


def tensor_runs(entries: dict[str, TensorEntry]) -> list[TensorRun]:
    """The entries in file order, grouped into maximal runs of adjacent same-dtype tensors."""
    ordered = sorted(entries.items(), key=lambda item: (str(item[1].shard), item[1].begin))
    runs: list[TensorRun] = []
    names: list[str] = []
    first: TensorEntry | None = None
    last: TensorEntry | None = None
    for name, entry in ordered:
        if first is not None and last is not None and (entry.shard != first.shard or entry.dtype != first.dtype
                                                        or entry.begin != last.end):
            runs.append(TensorRun(first.shard, first.dtype, first.begin, last.end, tuple(names)))
            first, names = None, []
        first = first or entry
        last = entry
        names.append(name)
    if first is not None and last is not None:
        runs.append(TensorRun(first.shard, first.dtype, first.begin, last.end, tuple(names)))
    return runs


def load_tensors(entries: dict[str, TensorEntry], maps: ShardMaps, target: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor as `target`: zero-copy views of the mapping where the stored dtype is the
    target (pages load when first used), else views of one converted copy per run."""
    tensors = {}
    for run in maps.runs(entries):
        flat = maps.flat(run.shard, run.dtype, run.begin, run.end)
        if flat.dtype != target:
            flat = flat.to(target)
        size = ITEM_SIZE[run.dtype]
        for name in run.names:
            entry = entries[name]
            start = (entry.begin - run.begin) // size
            tensors[name] = flat[start : start + (entry.end - entry.begin) // size].view(entry.shape)
    return tensors



SCAN_ELEMENTS = 1 << 24  # elements per isfinite pass: bounded temporaries on a 100 GB checkpoint


def first_non_finite(entries: dict[str, TensorEntry], maps: ShardMaps) -> str | None:
    """The name of the first tensor (in file order) holding a NaN or an Inf, or None. Runs
    of adjacent tensors are scanned as one span; only a span that fails is searched tensor
    by tensor."""
    for run in maps.runs(entries):
        if _all_finite(maps.flat(run.shard, run.dtype, run.begin, run.end)):
            continue
        for name in run.names:
            if not _all_finite(maps.tensor(entries[name]).reshape(-1)):
                return name
    return None


def _all_finite(flat: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(flat[start : start + SCAN_ELEMENTS]).all())
               for start in range(0, flat.numel(), SCAN_ELEMENTS))


def finite_marker(directory: Path, entries: dict[str, TensorEntry], cache_dir: Path) -> Path:
    """Where a finished scan of this checkpoint is remembered: keyed by the directory and
    the name, size and modification time of every shard, so a replaced shard is scanned again."""
    shards = sorted({e.shard for e in entries.values()})
    stats = [(s.name, s.stat().st_size, s.stat().st_mtime_ns) for s in shards]
    key = hashlib.sha256(json.dumps([str(directory.resolve()), stats]).encode()).hexdigest()[:16]
    return cache_dir / f"{key}.json"


def check_finite(directory: Path, entries: dict[str, TensorEntry], maps: ShardMaps,
                 cache_dir: Path | None = None) -> None:
    """Refuse a checkpoint with a NaN or an Inf in any tensor: such weights decode garbage,
    and the gpu_only reference decodes the same garbage, which a lossless check would pass.
    The scan reads every byte once; with `cache_dir` a passed scan is remembered there."""
    marker = finite_marker(directory, entries, cache_dir) if cache_dir is not None else None
    if marker is not None and marker.is_file():
        return
    bad = first_non_finite(entries, maps)
    if bad is not None:
        raise HarnessError(f"checkpoint {directory}: tensor {bad} holds NaN or Inf values; the weights are "
                           "corrupt, re-download or rebuild them")
    if marker is not None:
        with contextlib.suppress(OSError):  # an unwritable cache only costs the scan next time
            write_json_atomic(marker, {"checkpoint": str(directory.resolve()), "finite": True})

