"""Sets of expert ids packed as bits (bool [..., E] as uint64 words): a batch planner
carries residency forward forward by forward in a few tiny integer ops per row."""

from __future__ import annotations

import numpy as np

WORD = 64
BYTE_BITS = np.array([bin(b).count("1") for b in range(256)], np.uint8)


def pack(mask: np.ndarray) -> np.ndarray:
    """bool [..., E] -> uint64 [..., ceil(E / 64)]."""
    pad = -mask.shape[-1] % WORD
    if pad:
        mask = np.concatenate([mask, np.zeros((*mask.shape[:-1], pad), bool)], axis=-1)
    return np.ascontiguousarray(np.packbits(mask, axis=-1, bitorder="little")).view(np.uint64)


def unpack(words: np.ndarray, n_experts: int) -> np.ndarray:
    """uint64 [..., W] -> bool [..., n_experts]."""
    return np.unpackbits(words.view(np.uint8), axis=-1, count=n_experts, bitorder="little").view(bool)


def popcount(words: np.ndarray) -> np.ndarray:
    """Experts in each packed set [..., W] -> int64 [...]."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(words).sum(-1, dtype=np.int64)
    return BYTE_BITS[words.view(np.uint8)].sum(-1, dtype=np.int64)


def as_mask(sets: list[set[int]], n_experts: int) -> np.ndarray:
    """Per row, the experts of a set as a bool [len(sets), n_experts] mask."""
    mask = np.zeros((len(sets), n_experts), bool)
    for row, experts in enumerate(sets):
        mask[row, sorted(experts)] = True
    return mask


def as_sets(mask: np.ndarray) -> list[set[int]]:
    return [set(np.flatnonzero(row).tolist()) for row in mask]
