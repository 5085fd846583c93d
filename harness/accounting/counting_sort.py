"""Experts ordered by load, compiled: planners sort a layer's routed experts heaviest first
on every layer of every forward. Loads are token counts (at most a block's tokens x
top-k), so a counting sort beats a comparison sort there, and it is stable by design."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def heaviest_first(loads: np.ndarray) -> np.ndarray:
    """The routed experts (load > 0) of an int [E] load, most tokens first, ties to the
    lower id: `np.argsort(-loads, kind="stable")` without the unrouted ones.
    Twin: tests/kernels/test_counting_sort_kernel.py."""
    top = 0
    for e in range(loads.shape[0]):
        top = max(top, loads[e])
    # bucket b = top - load holds the experts of that load; starts[b]: where bucket b begins
    starts = np.zeros(top + 1, np.int64)
    for e in range(loads.shape[0]):
        if loads[e] > 0:
            starts[top - loads[e] + 1] += 1
    for b in range(1, top + 1):
        starts[b] += starts[b - 1]
    order = np.empty(starts[top], np.int64)
    for e in range(loads.shape[0]):
        if loads[e] > 0:
            order[starts[top - loads[e]]] = e
            starts[top - loads[e]] += 1
    return order
