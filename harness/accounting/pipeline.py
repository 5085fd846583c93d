"""Pipelined misses: the layer timeline of Mixtral-Offload's original expert cache.

The original (dvmazur/mixtral-offloading, `ExpertCache.load_experts`) computes the
experts a layer already holds first and loads its misses meanwhile, through a bounded
number of buffers: it starts `buffer_size - 1` loads at once (the demo's buffer_size=4:
3 loads in flight), and starts the next load each time a loaded expert is handed over to
compute. Charged here on the ledger's one PCIe link, per layer of n forwards at once:

    gpu_free = hits_start + sum of the hits' GPU seconds        (hits: resident GPU experts)
    for the i-th miss, in load order (ascending id):
        copy_end_i  = max(link, start_{i-k}) + copy_one          (k = loads in flight; no
                                                                  bound from start_{i-k} for i < k)
        start_i     = max(copy_end_i, gpu_free)
        gpu_free    = start_i + the miss's GPU seconds
    the GPU experts end at gpu_free; the link is free after the last copy.

With every miss's copy first and then every expert (the rule of `max_loads_in_flight=0`)
the layer would end at link + n_miss * copy_one + all GPU seconds; pipelining hides the
copies behind the hits and behind earlier misses' compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass
class MissPipeline:
    """n forwards x m layers of a pipelining system: its bound and what its layers load."""

    slots: int  # loads in flight (>= 1)
    hit_s: np.ndarray  # float [n, m]: GPU seconds of the GPU experts that were resident
    loads: np.ndarray  # int64 [n, m, E]
    to_load: np.ndarray  # bool [n, m, E]: the missed GPU experts, loaded in ascending id order
    table: np.ndarray  # float [max load + 1]: one expert's GPU seconds by its load


@njit(cache=True, nogil=True)
def pipelined_layer(hits_start: float, link_start: float, hit_s: float, miss_s: np.ndarray, n_miss: int,
                    copy_one: float, slots: int) -> tuple[float, float]:
    """(end of the GPU experts, link free) of one layer of one forward: its hits start at
    `hits_start` and take `hit_s`, the link is free at `link_start`, and miss_s[:n_miss]
    are the missed experts' GPU seconds in load order (compiled: the ledger's clock,
    harness/accounting/clock.py, calls it per layer). `slots` >= 1.
    Twin: tests/kernels/test_pipeline_kernel.py."""
    gpu_free = hits_start + hit_s
    link = link_start
    starts = np.empty(n_miss)
    for i in range(n_miss):
        if i >= slots:
            link = max(link, starts[i - slots])
        link += copy_one  # this miss's copy ends: the link is free again
        start = max(link, gpu_free)
        starts[i] = start
        gpu_free = start + miss_s[i]
    return gpu_free, link
