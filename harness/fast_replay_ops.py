"""Array operations behind harness/fast_replay.py, each a twin of what the engine does.

Packed expert sets (bool [..., E] as uint64 words) carry tide's residency forward cheaply;
`top_b` and `refresh_bits` are harness/tau_solver.py's `top_b_mask` and
`refresh_residency` on them; `torch_row_sums` and `running_sum` add seconds in the order
the engine adds them, so the fast replay's times are bit for bit the engine's. The tests
hold every twin equal to its original.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

WORD = 64
BYTE_BITS = np.array([bin(b).count("1") for b in range(256)], np.uint8)
TORCH_GRAIN = 32768 - 1  # at::internal::GRAIN_SIZE: smaller reductions run on the calling thread


# ---- packed expert sets and the ranking of harness/tau_solver.py ----------------------
def pack(mask: np.ndarray) -> np.ndarray:
    """bool [..., E] -> uint64 [..., ceil(E / 64)]."""
    pad = -mask.shape[-1] % WORD
    if pad:
        mask = np.concatenate([mask, np.zeros((*mask.shape[:-1], pad), bool)], axis=-1)
    return np.ascontiguousarray(np.packbits(mask, axis=-1, bitorder="little")).view(np.uint64)


def unpack(words: np.ndarray, n_experts: int) -> np.ndarray:
    """uint64 [..., W] -> uint8 0/1 [..., n_experts] (`.view(bool)` for a mask)."""
    return np.unpackbits(words.view(np.uint8), axis=-1, count=n_experts, bitorder="little")


def popcount(words: np.ndarray) -> np.ndarray:
    """Experts in each packed set [..., W] -> int64 [...]."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(words).sum(-1, dtype=np.int64)
    return BYTE_BITS[words.view(np.uint8)].sum(-1, dtype=np.int64)


def as_mask(sets: list[set[int]], n_experts: int) -> np.ndarray:
    mask = np.zeros((len(sets), n_experts), bool)
    for row, experts in enumerate(sets):
        mask[row, sorted(experts)] = True
    return mask


def top_b(load: np.ndarray, capacity: int) -> np.ndarray:
    """`top_b_mask`: the top-`capacity` routed experts by load, ties to the lower id."""
    n_experts = load.shape[-1]
    if capacity <= 0:
        return np.zeros(load.shape, bool)
    if capacity >= n_experts:
        return load > 0
    # one unique key per expert (load, then lower id first); the top-B keys are those at or
    # above the capacity-th largest, found by a partial sort; routed experts have keys >= E
    dtype = np.int64 if load.size and (int(load.max()) + 1) * n_experts >= 2**31 else np.int32
    key = load.astype(dtype, copy=False) * dtype(n_experts)
    key += np.arange(n_experts - 1, -1, -1, dtype=dtype)
    kth = np.partition(key, n_experts - capacity, axis=-1)[..., n_experts - capacity, None]
    return key >= np.maximum(kth, n_experts)


def refresh_bits(resident: np.ndarray, target: np.ndarray, n_target: np.ndarray, capacity: int,
                 n_experts: int) -> np.ndarray:
    """`refresh_residency` on packed rows [L, W] (`n_target`: each target row's size).

    A refresh demotes |resident - target| + |target| - B experts when that is positive: all
    of resident - target when the target is full (|target| = B), so such a row ends as the
    target, and a row that demotes nothing ends as resident | target. Otherwise the target
    is short of B because it holds every routed expert, so the candidates all have load 0
    and `refresh_residency`'s order (lowest load, then lowest id) is the lowest ids."""
    n_demote = popcount(resident & ~target) + n_target - capacity
    demoting = n_demote > 0
    after = np.where(demoting[:, None], target, resident | target)
    partial = np.flatnonzero(demoting & (n_target < capacity))
    if partial.size:
        candidates = unpack(resident[partial] & ~target[partial], n_experts).view(bool)
        kept = candidates & (np.cumsum(candidates, axis=-1) > n_demote[partial, None])
        after[partial] |= pack(kept)
    return after


# ---- sums in the engine's order -----------------------------------------------------
def constant_row_sums(value: float, lengths: np.ndarray) -> np.ndarray:
    """`torch_row_sums` of runs that all hold `value`."""
    sums = np.zeros(len(lengths))
    for k in np.unique(lengths).tolist():
        if k:
            sums[lengths == k] = constant_sum(value, k)
    return sums


@functools.lru_cache(maxsize=4096)
def constant_sum(value: float, k: int) -> float:
    return float(torch.full((k,), value, dtype=torch.float64).sum())


def torch_row_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sums of consecutive runs of `values` (run i has lengths[i] entries), bit for bit
    as torch sums each run as a 1-D tensor: runs of one length are summed as the rows of
    2-D tensors, which torch reduces row by row with the same kernel (in blocks under
    torch's parallel grain, so no thread pool is woken for a few microseconds of work)."""
    sums = np.zeros(len(lengths))
    order = np.argsort(lengths, kind="stable")
    ordered = lengths[order]
    # every run, regrouped by length: one gather, then each length is a contiguous block
    starts = np.cumsum(lengths) - lengths
    index = np.repeat(starts[order] - (np.cumsum(ordered) - ordered), ordered) + np.arange(int(ordered.sum()))
    grouped = values[index]
    offset = 0
    for group in np.split(order, np.flatnonzero(np.diff(ordered)) + 1):
        k = int(lengths[group[0]]) if group.size else 0
        step = max(1, TORCH_GRAIN // max(k, 1))
        for first in range(0, len(group) if k else 0, step):
            rows = group[first : first + step]
            block = grouped[offset : offset + len(rows) * k].reshape(len(rows), k)
            sums[rows] = torch.from_numpy(block).sum(-1).numpy()
            offset += len(rows) * k
    return sums


def running_sum(start: float, values: np.ndarray) -> float:
    """start + v0 + v1 + ... added in this order, as the engine's `+=` adds them."""
    return float(np.add.accumulate(np.concatenate(([start], np.ravel(values))))[-1])
