"""Float sums in the order the accounts are defined in, so that a batch of forwards adds
the same bits as adding layer after layer.

A layer's GPU (CPU) seconds are the torch sum of its experts' times in ascending id order
(`float(cost.gpu_expert_times(loads).sum())`); `row_sums` gives that sum for many layers at
once: runs of one length are summed as the rows of a 2-D tensor, which torch reduces row
by row with the kernel it uses for a 1-D tensor. A counter adds layer after layer
(`running_sum`). tests/unit/test_ledger.py holds both to the element-by-element definition.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

TORCH_GRAIN = 32768 - 1  # at::internal::GRAIN_SIZE: smaller reductions run on the calling thread


@functools.lru_cache(maxsize=4096)
def constant_sum(value: float, k: int) -> float:
    """The torch sum of k copies of `value`."""
    return float(torch.full((k,), value, dtype=torch.float64).sum())


def torch_sum(values: np.ndarray) -> float:
    """`float(torch.from_numpy(values).sum())` of a float64 vector (cached when the
    entries are all equal: the common case of memory-bound experts)."""
    if not values.size:
        return 0.0
    if (values == values[0]).all():
        return constant_sum(float(values[0]), int(values.size))
    return float(torch.from_numpy(values).sum())


def constant_row_sums(value: float, lengths: np.ndarray) -> np.ndarray:
    """`row_sums` of runs that all hold `value`: a sum depends only on the run's length,
    so it is looked up (one table per value, lengths up to a power of two)."""
    longest = int(lengths.max()) if len(lengths) else 0
    return _constant_sums(value, 1 << longest.bit_length())[lengths]


@functools.lru_cache(maxsize=256)
def _constant_sums(value: float, size: int) -> np.ndarray:
    """The torch sums of 0, 1, ..., size - 1 copies of `value`."""
    sums = np.array([constant_sum(value, k) if k else 0.0 for k in range(size)])
    sums.flags.writeable = False
    return sums


def row_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sums of consecutive runs of `values` (run i has lengths[i] entries), bit for bit as
    torch sums each run as a 1-D float64 tensor."""
    return RowSums(lengths)(values)


class RowSums:
    """`row_sums` for one `lengths`, its grouping of the runs by length worked out once:
    summing other values over the same runs (the sensitivity analysis re-charges the same
    placements under many cost models) only gathers and sums."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths
        order = np.argsort(lengths, kind="stable")
        ordered = lengths[order]
        # every run, regrouped by length: one gather, then each length is a contiguous block
        starts = np.cumsum(lengths) - lengths
        index = np.repeat(starts[order] - (np.cumsum(ordered) - ordered), ordered) + np.arange(int(ordered.sum()))
        self.index = index.astype(np.int32) if len(index) < 2**31 else index  # kept: half the memory
        self.groups = np.split(order, np.flatnonzero(np.diff(ordered)) + 1)

    def __call__(self, values: np.ndarray) -> np.ndarray:
        if values.size and (values == values[0]).all():
            return constant_row_sums(float(values[0]), self.lengths)
        return self.grouped_sums(self.grouped(values))

    def grouped(self, values: np.ndarray) -> np.ndarray:
        """`values` (in row order) regrouped as `grouped_sums` takes them: a caller that sums
        functions of the same values many times regroups the values once."""
        return values[self.index]

    def grouped_sums(self, grouped: np.ndarray) -> np.ndarray:
        """The row sums of values already regrouped by `grouped`."""
        lengths = self.lengths
        sums = np.zeros(len(lengths))
        offset = 0
        for group in self.groups:
            k = int(lengths[group[0]]) if group.size else 0
            step = max(1, TORCH_GRAIN // max(k, 1))  # blocks under the grain: no thread pool woken
            for first in range(0, len(group) if k else 0, step):
                rows = group[first : first + step]
                block = grouped[offset : offset + len(rows) * k].reshape(len(rows), k)
                sums[rows] = torch.from_numpy(block).sum(-1).numpy()
                offset += len(rows) * k
        return sums


def table_row_sums(table: np.ndarray, loads: np.ndarray, mask: np.ndarray | Callable[[], np.ndarray],
                   lengths: np.ndarray | None = None, top: int | None = None) -> np.ndarray:
    """Per row of `mask` [..., E] (routed experts only: loads >= 1), `row_sums` of
    table[load] over its experts in id order; when the table is one value over the loads
    present (memory-bound experts), a lookup by row length without gathering anything.
    A caller that has counted them passes the row lengths and the largest load, and the
    mask as a function that builds it (only called when the gather is needed)."""
    if lengths is None or top is None:
        mask = mask() if callable(mask) else mask
        lengths, top = np.count_nonzero(mask, axis=-1), int(loads.max()) if loads.size else 0
    if top >= 1 and (table[1 : top + 1] == table[1]).all():
        return constant_row_sums(float(table[1]), lengths.ravel()).reshape(lengths.shape)
    picked = np.extract(mask() if callable(mask) else mask, loads)  # row-major: each row's experts in id order
    return row_sums(table[picked], lengths.ravel()).reshape(lengths.shape)


def running_sum(start: float, values: np.ndarray) -> float:
    """start + v0 + v1 + ... added in this order, as `total += v` adds them one by one."""
    return float(np.add.accumulate(np.concatenate(([start], np.ravel(values))))[-1])
