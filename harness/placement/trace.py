"""Routing traces: per (forward, MoE layer) expert loads recorded from a live run.

A trace is what `System.prepare` learns from (calibration) and what replay runs over.

In memory: `steps` (one StepInfo per model forward, with the tokens it ran and the
context they attended to) and `loads`, an int32 tensor [n_steps, n_moe_layers,
n_experts] of tokens routed to each expert; optional hints per channel (float32, same
shape, row l predicts layer l+1, zeros where none was recorded; harness/model/hints.py):
`next_gate`, the next MoE layer's gate applied to this layer's router input, summed over
tokens as predicted loads; `residual`, the same gate on the input's deviation from the
layer's running mean (recordings since the residual channel; older recordings, imports and
generated traces have none).

On disk (`save` / `load`): one compressed `.npz`, written atomically, holding
  schema_version  int        TRACE_SCHEMA (a mismatch is refused with one line)
  geometry        json str   the nominal geometry of the run (MoEGeometry.to_dict: n layers, experts, ...)
  meta            json str   free-form provenance (model, weights, decode settings)
  loads           int32      [S, L, E]
  hints           float32    [S, L, E] the next_gate channel (only if recorded)
  residual_hints  float32    [S, L, E] the residual channel (only if recorded)
  step_prompt, step_block, step_step, step_global, step_first_block, step_kind,
  step_tokens, step_context  int32 [S]  (step_kind: 0 prefill, 1 denoise, 2 commit, 3 decode)
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.common.errors import HarnessError
from harness.common.files import write_atomic
from harness.common.paths import require_regular_file
from harness.model.hints import HINT_CHANNELS, NEXT_GATE, RESIDUAL
from harness.placement.steps import StepInfo

TRACE_SCHEMA = 1
KINDS = ("prefill", "denoise", "commit", "decode")  # append only: indices are stored
CHANNEL_ARRAYS = {NEXT_GATE: "hints", RESIDUAL: "residual_hints"}  # each hint channel's array in the file
# meta["hints"] of traces whose hints are no model's router but a stand-in predictor (an
# import's true next-layer loads, a generated trace's): they stand in for every channel
STAND_IN_HINTS = ("next_layer_loads", "generated")


@dataclass
class RoutingTrace:
    n_layers: int
    n_experts: int
    steps: list[StepInfo] = field(default_factory=list)
    n_tokens: list[int] = field(default_factory=list)
    n_context: list[int] = field(default_factory=list)
    geometry: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    _loads: list[torch.Tensor] = field(default_factory=list, repr=False)
    _hints: list[torch.Tensor | None] = field(default_factory=list, repr=False)  # the next_gate channel
    _residual: list[torch.Tensor | None] = field(default_factory=list, repr=False)  # the residual channel
    _stacked: torch.Tensor | None = field(default=None, repr=False)  # `loads`, until the next change
    # what others derive from the loads and keep with them (TIDE's refresh windows), until the next change
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def add_step(self, step: StepInfo, n_tokens: int = 0, n_context: int = 0) -> None:
        self._stacked = None
        self.memo.clear()
        self.steps.append(step)
        self.n_tokens.append(n_tokens)
        self.n_context.append(n_context)
        self._loads.append(torch.zeros(self.n_layers, self.n_experts, dtype=torch.int32))
        self._hints.append(None)
        self._residual.append(None)

    def _channel(self, channel: str) -> list[torch.Tensor | None]:
        if channel == NEXT_GATE:
            return self._hints
        if channel == RESIDUAL:
            return self._residual
        raise ValueError(f"unknown hint channel {channel!r}; the channels are {', '.join(HINT_CHANNELS)}")

    def record(self, layer: int, load: torch.Tensor,
               hint: torch.Tensor | Mapping[str, torch.Tensor] | None = None) -> None:
        """Record one layer's load for the current (last added) step, and its hints: a
        tensor is the next_gate channel's, a mapping names each channel's."""
        self._stacked = None
        self.memo.clear()
        self._loads[-1][layer] = load.to(torch.int32)
        hints = {NEXT_GATE: hint} if isinstance(hint, torch.Tensor) else (hint or {})
        for channel, value in hints.items():
            rows = self._channel(channel)
            if rows[-1] is None:
                rows[-1] = torch.zeros(self.n_layers, self.n_experts, dtype=torch.float32)
            rows[-1][layer] = value.float()

    def set_step(self, step: int, loads: np.ndarray, hints: np.ndarray | None = None,
                 residual: np.ndarray | None = None) -> None:
        """Set a whole forward's loads [L, E] (and its hints of each channel) at once (a trace built from another)."""
        self._stacked = None
        self._loads[step] = torch.from_numpy(np.ascontiguousarray(loads, dtype=np.int32))
        self._hints[step] = None if hints is None else torch.from_numpy(np.ascontiguousarray(hints, np.float32))
        self._residual[step] = None if residual is None else torch.from_numpy(np.ascontiguousarray(residual,
                                                                                                   np.float32))

    @property
    def loads(self) -> torch.Tensor:
        if not self._loads:
            return torch.zeros(0, self.n_layers, self.n_experts, dtype=torch.int32)
        if self._stacked is None:
            self._stacked = torch.stack(self._loads)
        return self._stacked

    @property
    def has_hints(self) -> bool:
        """Whether any forward carries next_gate hints (the channel every hint-carrying trace has)."""
        return any(h is not None for h in self._hints)

    def _rows(self, channel: str) -> list[torch.Tensor | None]:
        """A channel's rows as readers see them: its own, or a stand-in trace's one predictor."""
        rows = self._channel(channel)
        if self.meta.get("hints") in STAND_IN_HINTS and not any(h is not None for h in rows):
            return self._hints
        return rows

    def has_channel(self, channel: str) -> bool:
        return any(h is not None for h in self._rows(channel))

    def hint(self, step: int, layer: int, channel: str = NEXT_GATE) -> torch.Tensor | None:
        h = self._rows(channel)[step]
        return None if h is None else h[layer]

    def step_hints(self, step: int, channel: str = NEXT_GATE) -> torch.Tensor | None:
        """A forward's hints [L, E] of `channel` (row l predicts layer l+1), or None if it
        recorded none (a stand-in trace's hints serve every channel: STAND_IN_HINTS)."""
        return self._rows(channel)[step]

    def __len__(self) -> int:
        return len(self.steps)

    def forward_size(self, step: int, top_k: int) -> tuple[int, int]:
        """(tokens, context) a replay gives forward `step`: what the trace recorded; where
        it recorded none (0), tokens from the loads (every token routes to top_k experts,
        so the busiest layer has top_k pairs per token) and the context equals them."""
        n_tokens = self.n_tokens[step]
        if not n_tokens:
            loads = self.loads[step]
            n_tokens = -(-int(loads.sum(-1).max()) // top_k) if loads.shape[0] else 0
        return n_tokens, self.n_context[step] or n_tokens

    # ---- files -------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        arrays: dict[str, np.ndarray] = {
            "schema_version": np.array(TRACE_SCHEMA),
            "geometry": np.array(json.dumps(self.geometry)),
            "meta": np.array(json.dumps(self.meta, default=str)),
            "shape": np.array([self.n_layers, self.n_experts]),
            "loads": self.loads.numpy(),
            "step_prompt": np.array([s.prompt for s in self.steps], dtype=np.int32),
            "step_block": np.array([s.block for s in self.steps], dtype=np.int32),
            "step_step": np.array([s.step for s in self.steps], dtype=np.int32),
            "step_global": np.array([s.global_step for s in self.steps], dtype=np.int32),
            "step_first_block": np.array([s.is_first_block for s in self.steps], dtype=np.int32),
            "step_kind": np.array([KINDS.index(s.kind) for s in self.steps], dtype=np.int32),
            "step_tokens": np.array(self.n_tokens, dtype=np.int32),
            "step_context": np.array(self.n_context, dtype=np.int32),
        }
        zeros = torch.zeros(self.n_layers, self.n_experts)
        for channel, key in CHANNEL_ARRAYS.items():
            if self.has_channel(channel):
                arrays[key] = torch.stack([h if h is not None else zeros for h in self._channel(channel)]).numpy()
        return write_atomic(path, lambda f: np.savez_compressed(f, **arrays))

    @classmethod
    def load(cls, path: str | Path) -> RoutingTrace:
        """Read a trace file; anything but a well-formed trace is a one-line HarnessError
        (never a pickle load: np.load(allow_pickle=False)): sizes declared within the file,
        at least one forward, loads no larger than the forwards' tokens can route."""
        path = Path(path)
        data = read_arrays(path)
        if "schema_version" not in data:
            raise HarnessError(f"trace {path} is corrupt or not a trace (it has no schema_version); record it again")
        version = _scalar_int(data.get("schema_version"))
        if version != TRACE_SCHEMA:
            raise HarnessError(f"trace {path} has schema version {version}, this harness reads {TRACE_SCHEMA}; "
                               "record it again with this version")
        try:
            return cls._from_arrays(data)
        except (KeyError, ValueError, TypeError, IndexError, OverflowError, RecursionError) as exc:
            raise HarnessError(f"trace {path} is corrupt ({_reason(exc)}); record it again") from None

    @classmethod
    def _from_arrays(cls, data: dict[str, np.ndarray]) -> RoutingTrace:
        shape = data["shape"]
        if shape.shape != (2,) or shape.dtype.kind not in "iu":
            raise ValueError("shape must be two integers")
        n_layers, n_experts = (int(v) for v in shape)
        loads_np = _integer_array(data["loads"], "loads", ndim=3)
        n = loads_np.shape[0]
        if n == 0:
            raise ValueError("it holds no forwards")
        if loads_np.shape[1:] != (n_layers, n_experts):
            raise ValueError(f"loads has shape {loads_np.shape[1:]}, shape says {(n_layers, n_experts)}")
        columns = [_integer_array(data[k], k, ndim=1) for k in STEP_COLUMNS]
        if any(len(c) != n for c in columns):
            raise ValueError("step columns and loads differ in length")
        if (loads_np < 0).any() or any((c < 0).any() for c in columns):
            raise ValueError("negative loads or step fields")
        prompt, block, step, glob, first, kind, tokens, context = columns
        if (kind >= len(KINDS)).any():
            raise ValueError(f"step_kind outside 0..{len(KINDS) - 1}")
        geometry = _json_object(data["geometry"], "geometry")
        _check_pairs(loads_np, tokens, geometry.get("num_experts_per_tok"))
        channels: dict[str, torch.Tensor] = {}
        for channel, key in CHANNEL_ARRAYS.items():
            if key in data:
                hints_np = data[key]
                if hints_np.shape != loads_np.shape or hints_np.dtype.kind != "f" or not np.isfinite(hints_np).all():
                    raise ValueError(f"{key} must be finite floats shaped like loads")
                channels[channel] = torch.from_numpy(hints_np.astype(np.float32))
        trace = cls(n_layers, n_experts, geometry=geometry, meta=_json_object(data["meta"], "meta"))
        loads = torch.from_numpy(loads_np.astype(np.int32))
        for i in range(n):
            info = StepInfo(int(prompt[i]), int(block[i]), int(step[i]), int(glob[i]), bool(first[i]),
                            KINDS[int(kind[i])])
            trace.add_step(info, int(tokens[i]), int(context[i]))
            trace._loads[-1] = loads[i].clone()
            trace._stacked = None
            for channel, hints in channels.items():
                trace._channel(channel)[-1] = hints[i].clone()
        trace._stacked = loads
        return trace


STEP_COLUMNS = ("step_prompt", "step_block", "step_step", "step_global", "step_first_block", "step_kind",
                "step_tokens", "step_context")
INT32_MAX = np.iinfo(np.int32).max


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an .npz file; a missing, truncated or foreign file is a HarnessError,
    and so is a member whose header declares more data than it holds (checked before
    anything is allocated: a header may declare petabytes)."""
    require_regular_file(path, f"trace {path}", "give a trace.npz file recorded by a live run (trace.record=true)")
    with path.open("rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise HarnessError(f"trace {path} is a single .npy array, not a trace archive (.npz); "
                           "give the trace.npz a live run recorded")
    try:
        check_declared_sizes(path)
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):  # a bare .npy, not an archive
                raise ValueError("not an .npz archive")
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, KeyError,
            RuntimeError, MemoryError) as exc:
        kind = type(exc).__name__
        raise HarnessError(f"trace {path} is corrupt or not a trace ({kind}); record it again") from None


def _npy_header(member: Any) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(member)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f"npy format version {version}")
    shape, _, dtype = readers[version](member)
    return shape, dtype


MAX_DEFLATE_RATIO = 1100  # deflate expands at most ~1032x: a member claiming more is a zip bomb


def check_declared_sizes(path: Path) -> None:
    """Each .npy member's header (shape x dtype) against the bytes the member holds, and
    the member's size against what its compressed bytes can expand to."""
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            limit = info.compress_size * MAX_DEFLATE_RATIO + 2**16
            if info.compress_type != zipfile.ZIP_STORED and info.file_size > limit:
                raise HarnessError(f"trace {path} is corrupt: member {info.filename} claims {info.file_size} "
                                   f"bytes from {info.compress_size} compressed; record it again")
            with archive.open(info) as member:
                shape, dtype = _npy_header(member)
                header = member.tell() if member.seekable() else None
            need = math.prod(shape) * dtype.itemsize
            if dtype.hasobject or header is None or need != info.file_size - header:
                raise HarnessError(f"trace {path} is corrupt: member {info.filename} declares shape {shape} of "
                                   f"{dtype} ({need} bytes) but holds {info.file_size - (header or 0)}; "
                                   "record it again")


def _scalar_int(value: np.ndarray | None) -> int:
    if value is None or value.shape != () or value.dtype.kind not in "iu":
        return -1
    return int(value)


def _integer_array(value: np.ndarray, name: str, ndim: int) -> np.ndarray:
    if value.ndim != ndim or value.dtype.kind not in "iub":
        raise ValueError(f"{name} must be a {ndim}-d integer array, got {value.dtype} {value.shape}")
    if value.size and value.max() > INT32_MAX:
        raise ValueError(f"{name} has values beyond int32")
    return value


def _check_pairs(loads: np.ndarray, tokens: np.ndarray, top_k: Any) -> None:
    """Every token of a forward is routed to top_k experts in each MoE layer, so a layer's
    loads add up to at most tokens x top_k pairs (a forward that recorded no token count,
    0, is not checked); more means the loads do not belong to these forwards."""
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k <= 0 or not loads.size:
        return
    pairs = loads.astype(np.int64).sum(axis=2).max(axis=1)  # the busiest layer of each forward
    allowed = tokens.astype(np.int64) * top_k
    bad = np.flatnonzero((tokens > 0) & (pairs > allowed))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"forward {i} routes {int(pairs[i])} token-expert pairs in one layer, but its "
                         f"{int(tokens[i])} tokens x top-{top_k} make {int(allowed[i])}")


def _json_object(value: np.ndarray, name: str) -> dict[str, Any]:
    if value.shape != () or value.dtype.kind != "U":
        raise ValueError(f"{name} must be a JSON string")
    parsed = json.loads(str(value))
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must be a JSON object, not a {type(parsed).__name__}")
    return parsed


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} array"
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def derive_no_cache(trace: RoutingTrace) -> RoutingTrace:
    """The `cache=none` trace of a prefix-cached decode, at prefix cost.

    Under the block-causal mask a token attends only to its own and earlier blocks, so the
    prompt's whole blocks and every committed block have the same hidden states, hence the
    same routing, in every later forward: a no-cache denoising step routes the current
    block (its denoise forward) plus the fixed loads of the prefill and of the commits
    before it. Hints (sums over tokens) add the same way, each channel apart; a residual
    hint's rows keep the running mean of the forward that computed them (a no-cache decode
    would see the prefix again, so its means differ: an approximation, docs/dali-and-gem.md).
    The derived trace has one
    denoise step per recorded one, numbered as a no-cache decode numbers them; its token
    and context counts are the whole window, as a no-cache forward's.
    """
    derived = RoutingTrace(trace.n_layers, trace.n_experts, geometry=dict(trace.geometry),
                           meta={**trace.meta, "derived_from": "prefix"})
    decode_meta = dict(trace.meta.get("decode", {}))
    if decode_meta:
        decode_meta["cache"] = "none"
        derived.meta["decode"] = decode_meta
    loads = trace.loads
    fixed, fixed_tokens, prompt = None, 0, None
    fixed_hint: dict[str, torch.Tensor | None] = {}
    global_step = (trace.steps[0].global_step if trace.steps else 0) - 1  # no-cache decodes count denoise steps only
    for i, step in enumerate(trace.steps):
        if step.prompt != prompt:  # a new prompt starts with nothing fixed
            prompt, fixed, fixed_tokens = step.prompt, torch.zeros_like(loads[i]), 0
            fixed_hint = dict.fromkeys(HINT_CHANNELS)
        hints = {c: trace._channel(c)[i] for c in HINT_CHANNELS}
        if step.kind in ("prefill", "commit"):
            fixed = fixed + loads[i]
            fixed_tokens += trace.n_tokens[i]
            for c, hint in hints.items():
                if hint is not None:
                    before = fixed_hint[c]
                    fixed_hint[c] = hint.clone() if before is None else before + hint
            continue
        global_step += 1
        window = fixed_tokens + trace.n_tokens[i]
        derived.add_step(StepInfo(step.prompt, step.block, step.step, global_step, step.is_first_block), window,
                         window)
        derived._loads[-1] = fixed + loads[i]
        for c, hint in hints.items():
            parts = [h for h in (fixed_hint[c], hint) if h is not None]
            if parts:
                derived._channel(c)[-1] = parts[0] + parts[1] if len(parts) == 2 else parts[0].clone()
    derived._stacked = None
    return derived
