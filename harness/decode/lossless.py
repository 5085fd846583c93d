"""The lossless check: every run's tokens against the gpu_only reference.

Reference tokens for (model, weights, workload, decode settings) are decoded once with
every expert in place and cached; other runs compare token ids position by position.
On one device the engine's canonical combine makes every system bit-identical, so any
mismatch there is a bug. On CUDA, CPU and GPU kernels round differently, so the match
rate and the first differing position are what the check reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.common.files import read_json, write_json_atomic


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


def load_reference(cache_dir: str | Path, key: str) -> list[list[int]] | None:
    path = reference_path(cache_dir, key)
    if not path.exists():
        return None
    try:
        return read_json(path)["tokens"]
    except (ValueError, KeyError):  # a damaged cache entry is recomputed, never trusted
        return None


def store_reference(cache_dir: str | Path, key: str, tokens: list[list[int]], meta: dict[str, Any]) -> Path:
    return write_json_atomic(reference_path(cache_dir, key), {"meta": meta, "tokens": tokens})
