"""The lossless check: every run's tokens against the gpu_only reference.

Reference tokens for (model, weights, workload, decode settings) are decoded once with
every expert in place and cached; other runs compare token ids position by position.
On one device the engine's canonical combine makes every system bit-identical, so any
mismatch there is a bug. On CUDA, CPU and GPU kernels round differently, so the match
rate and the first differing position are what the check reports.

A cached entry holds its key and a digest of its tokens; one that does not match its key,
its digest or the workload's shape is recomputed (`load_reference` returns None).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.common.files import read_json, write_json_atomic
from harness.common.paths import file_kind


@dataclass(frozen=True)
class LosslessCheck:
    lossless: bool
    token_match_rate: float
    first_diff_prompt: int | None  # index of the first prompt that differs
    first_diff_position: int | None  # position within its generated tokens

    def metrics(self) -> dict[str, Any]:
        return {
            "lossless": int(self.lossless),
            "token_match_rate": self.token_match_rate,
            "first_diff_prompt": -1 if self.first_diff_prompt is None else self.first_diff_prompt,
            "first_diff_position": -1 if self.first_diff_position is None else self.first_diff_position,
        }


def compare_tokens(reference: list[list[int]], tokens: list[list[int]]) -> LosslessCheck:
    if len(reference) != len(tokens):
        raise ValueError(f"{len(tokens)} outputs against {len(reference)} reference outputs")
    total = same = 0
    first: tuple[int, int] | None = None
    for p, (ref, got) in enumerate(zip(reference, tokens, strict=True)):
        length = max(len(ref), len(got))
        for i in range(length):
            ok = i < len(ref) and i < len(got) and ref[i] == got[i]
            same += ok
            if not ok and first is None:
                first = (p, i)
        total += length
    rate = same / total if total else 1.0
    return LosslessCheck(first is None, rate, *(first if first else (None, None)))


def reference_path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / "reference" / f"{key}.json"


def tokens_digest(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()


def load_reference(cache_dir: str | Path, key: str, shape: tuple[int, ...] | None = None) -> list[list[int]] | None:
    """The cached reference tokens of `key`, or None when there are none or the entry does
    not match: another key, a digest that does not match its tokens (a damaged file), or
    not `shape` = (prompts, gen_length[, shortest]) lists of ids (rows of gen_length ids, or of
    shortest to gen_length when decode.gen_length_bucket trims each prompt's generation). A
    None is recomputed, never compared."""
    path = reference_path(cache_dir, key)
    if file_kind(path) != "file":
        return None  # missing, or something write_atomic will replace with the real entry
    try:
        entry = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    tokens = entry.get("tokens")
    if not _is_token_table(tokens, shape) or entry.get("digest") != tokens_digest(tokens):
        return None
    return tokens


def _is_token_table(tokens: Any, shape: tuple[int, ...] | None) -> bool:
    if not isinstance(tokens, list) or not all(isinstance(row, list) for row in tokens):
        return False
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for row in tokens for t in row):
        return False
    if shape is None:
        return True
    n, longest, shortest = (*shape, shape[-1])[:3]
    return len(tokens) == n and all(shortest <= len(row) <= longest for row in tokens)


def store_reference(cache_dir: str | Path, key: str, tokens: list[list[int]], meta: dict[str, Any]) -> Path:
    entry = {"key": key, "meta": meta, "digest": tokens_digest(tokens), "tokens": tokens}
    return write_json_atomic(reference_path(cache_dir, key), entry)
