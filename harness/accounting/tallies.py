"""Per-layer tallies of recorded layer outcomes, in one compiled pass (the ledger's counts).

The ledger charges live forwards in chunks of [forwards, layers, E] outcomes; counting
what each layer routed, missed and ran where is a handful of reductions over those
arrays, each a full pass in numpy. One numba loop does them all at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass
class LayerTallies:
    """Per recorded layer [n, m] (int64): token-expert pairs routed, pairs whose expert
    missed, tokens run on the CPU; and experts on the GPU, on the CPU, resident on the GPU
    (hits), missed on the GPU (to load). `top`: the largest load of any expert."""

    routed: np.ndarray
    missed: np.ndarray
    cpu_tokens: np.ndarray
    n_gpu: np.ndarray
    n_cpu: np.ndarray
    n_hit: np.ndarray
    n_to_load: np.ndarray
    top: int


def layer_tallies(loads: np.ndarray, on_gpu: np.ndarray, missed: np.ndarray) -> LayerTallies:
    """loads int64 [n, m, E]; on_gpu / missed bool [n, m, E] (subsets of the routed experts)."""
    return LayerTallies(*_tallies(loads, on_gpu, missed))


@njit(cache=True, nogil=True)
def _tallies(loads: np.ndarray, on_gpu: np.ndarray, missed: np.ndarray) -> tuple:
    """`LayerTallies`' fields in its order, over the routed experts (load != 0) of each
    recorded layer. Twin: tests/kernels/test_tallies_kernel.py."""
    n, m, experts = loads.shape
    routed, miss, cpu_tokens = np.zeros((n, m), np.int64), np.zeros((n, m), np.int64), np.zeros((n, m), np.int64)
    n_gpu, n_cpu = np.zeros((n, m), np.int64), np.zeros((n, m), np.int64)
    n_hit, n_to_load = np.zeros((n, m), np.int64), np.zeros((n, m), np.int64)
    top = 0
    for i in range(n):
        for j in range(m):
            for e in range(experts):
                load = loads[i, j, e]
                if load == 0:
                    continue
                top = max(top, load)
                routed[i, j] += load
                if missed[i, j, e]:
                    miss[i, j] += load
                if on_gpu[i, j, e]:
                    n_gpu[i, j] += 1
                    if missed[i, j, e]:
                        n_to_load[i, j] += 1
                    else:
                        n_hit[i, j] += 1
                else:
                    n_cpu[i, j] += 1
                    cpu_tokens[i, j] += load
    return routed, miss, cpu_tokens, n_gpu, n_cpu, n_hit, n_to_load, top
