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


@dataclass
class MissPipeline:
    """n forwards x m layers of a pipelining system: its bound and the GPU seconds split."""

    slots: int  # loads in flight (>= 1)
    hit_s: np.ndarray  # float [n, m]: GPU seconds of the GPU experts that were resident
    miss_s: np.ndarray  # float [n, m, K]: GPU seconds of each missed GPU expert, in load order, 0-padded
    n_miss: np.ndarray  # int [n, m]


def pipelined_layer(hits_start: np.ndarray, link_start: np.ndarray, hit_s: np.ndarray, miss_s: np.ndarray,
                    n_miss: np.ndarray, copy_one: float, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(end of the GPU experts, link free) of one layer of n forwards; miss_s [n, K].

    The forwards are taken most misses first, so the ones still loading at miss i are a
    prefix of the rows and each step works on that prefix in place."""
    n, width = miss_s.shape
    order = np.argsort(-n_miss, kind="stable")
    gpu_free = (hits_start + hit_s)[order]
    link = link_start[order]  # a copy: fancy indexing
    miss_s = miss_s[order]
    loading = np.searchsorted(-n_miss[order], -np.arange(width), side="left")  # rows with n_miss > i
    starts = np.empty((n, width))
    for i in range(width):
        k = int(loading[i])
        lk = link[:k]
        if i >= slots:
            np.maximum(lk, starts[:k, i - slots], out=lk)
        lk += copy_one  # this miss's copy ends: the link is free again
        start = np.maximum(lk, gpu_free[:k])
        starts[:k, i] = start
        np.add(start, miss_s[:k, i], out=gpu_free[:k])
    back = np.empty_like(order)
    back[order] = np.arange(n)
    return gpu_free[back], link[back]


def miss_pipeline(loads: np.ndarray, on_gpu: np.ndarray, missed: np.ndarray, gpu_table: np.ndarray,
                  hit_s: np.ndarray, slots: int) -> MissPipeline:
    """The pipeline inputs of n x m layers: the missed GPU experts' seconds in ascending
    id order (the order their copies are issued). hit_s: the resident GPU experts' seconds."""
    to_load = on_gpu & missed
    n_miss = np.count_nonzero(to_load, axis=-1)
    width = int(n_miss.max()) if n_miss.size else 0
    order = np.argsort(~to_load, axis=-1, kind="stable")[..., :width]  # the misses first, by id
    seconds = np.take_along_axis(gpu_table[loads], order, -1)
    seconds = np.where(np.arange(width) < n_miss[..., None], seconds, 0.0)
    return MissPipeline(slots, hit_s, seconds, n_miss)
