"""The forward's clock: the ledger's timeline (harness/accounting/ledger.py states the rules),
compiled.

One scalar loop per forward over its recorded layers, each float computed op for op as
the rules state it (tests/kernels/test_clock_kernel.py holds it to a layer-by-layer
reference written in plain Python). numba compiles the loop: charging a chunk of forwards costs well under
a microsecond per layer, where the same recurrence written as numpy operations over the
forwards cost about ten calls of ~1 us per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from harness.accounting.pipeline import MissPipeline, pipelined_layer


@dataclass
class ForwardTimes:
    copies_s: np.ndarray  # [n, m] exposed copy waits
    cpu_exposed_s: np.ndarray  # [n, m] CPU time past the GPU path
    drain_s: np.ndarray  # [n] async copies still on the link when the forward ends
    total_s: np.ndarray  # [n] the forward's modeled seconds


def forward_times(parts: np.ndarray, n_moe_layers: int, gpu_s: np.ndarray, cpu_s: np.ndarray, n_sync: np.ndarray,
                  n_async: np.ndarray, copy_one: float, overlap: bool, wait_row: np.ndarray | None = None,
                  wait_copies: np.ndarray | None = None, pipeline: MissPipeline | None = None,
                  cpu_after_copies: bool = False) -> ForwardTimes:
    """The clock of n forwards of m recorded layers each (harness/accounting/ledger.py).
    parts: [n, 3] non-expert seconds (before the MoE layers, per MoE layer, head);
    n_sync / n_async: [n, m] copies; wait_row / wait_copies: [n, m] the async copies each
    layer's GPU experts wait for (row of the forward that issued them, how many of its
    copies must have landed; 0: none); pipeline: the misses' copies overlap the GPU
    experts (harness/accounting/pipeline.py)."""
    n, m = gpu_s.shape
    no_wait = np.zeros((n, m), np.int64)
    if pipeline is None:
        slots, hit_s, loads, to_load, table = 0, _floats(gpu_s), np.zeros((n, m, 0), np.int64), \
            np.zeros((n, m, 0), bool), np.zeros(1)
    else:
        slots, hit_s, loads, to_load, table = pipeline.slots, _floats(pipeline.hit_s), _ints(pipeline.loads), \
            np.ascontiguousarray(pipeline.to_load), _floats(pipeline.table)
    copies, exposed, drain, total = _clock(
        _floats(parts), n_moe_layers, _floats(gpu_s), _floats(cpu_s), _ints(n_sync), _ints(n_async), float(copy_one),
        bool(overlap), no_wait if wait_row is None else _ints(wait_row),
        no_wait if wait_copies is None else _ints(wait_copies), slots, hit_s, loads, to_load, table,
        bool(cpu_after_copies),
    )
    return ForwardTimes(copies, exposed, drain, total)


def _floats(values: np.ndarray) -> np.ndarray:
    """float64, C-contiguous: one compiled variant of the clock serves every caller."""
    return np.ascontiguousarray(values, np.float64)


def _ints(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, np.int64)


@njit(cache=True, nogil=True)
def _clock(parts: np.ndarray, n_moe_layers: int, gpu_s: np.ndarray, cpu_s: np.ndarray, n_sync: np.ndarray,
           n_async: np.ndarray, copy_one: float, overlap: bool, wait_row: np.ndarray, wait_copies: np.ndarray,
           slots: int, hit_s: np.ndarray, loads: np.ndarray, to_load: np.ndarray, table: np.ndarray,
           cpu_after_copies: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`forward_times`' arrays (copies, exposed CPU, drain, total), one forward after the
    other, each a scalar loop over its layers in the ledger's rule (harness/accounting/ledger.py);
    `slots` 0: no miss pipeline (hit_s, loads, to_load and table unread).
    Twin: tests/kernels/test_clock_kernel.py (`ScalarTimeline`)."""
    n, m = gpu_s.shape
    copies, exposed = np.empty((n, m)), np.empty((n, m))
    drain, total = np.empty(n), np.empty(n)
    starts = np.empty(m)  # per layer of the forward: when its async copies start on the link
    miss_s = np.empty(to_load.shape[2])  # a pipelined layer's missed GPU experts' seconds, in load order
    for i in range(n):
        clock, per_layer, head = parts[i, 0], parts[i, 1], parts[i, 2]
        link_free = 0.0
        for j in range(m):
            clock = clock + per_layer
            t0 = clock
            has_sync = n_sync[i, j] > 0
            ready = t0
            if slots == 0 and has_sync:
                link_free = max(t0, link_free) + n_sync[i, j] * copy_one
                ready = link_free
            if wait_copies[i, j] > 0:  # a prefetched expert must have landed before it computes
                ready = max(ready, starts[wait_row[i, j]] + wait_copies[i, j] * copy_one)
            if slots == 0:
                gpu_end = ready + gpu_s[i, j]
                copies[i, j] = ready - t0
            else:
                n_miss = 0
                for e in range(to_load.shape[2]):
                    if to_load[i, j, e]:
                        miss_s[n_miss] = table[loads[i, j, e]]
                        n_miss += 1
                gpu_end, link_after = pipelined_layer(ready, max(t0, link_free), hit_s[i, j], miss_s, n_miss,
                                                      copy_one, slots)
                if has_sync:
                    link_free = link_after
                copies[i, j] = gpu_end - gpu_s[i, j] - t0  # the GPU's waits for copies
            start = max(t0, link_free)
            starts[j] = start
            if n_async[i, j] > 0:
                link_free = start + n_async[i, j] * copy_one
            cpu_start = ready if cpu_after_copies else t0
            end = max(gpu_end, cpu_start + cpu_s[i, j]) if overlap else gpu_end + cpu_s[i, j]
            exposed[i, j] = end - gpu_end
            clock = end
        # MoE layers that recorded nothing still ran their attention, router and shared expert
        clock = clock + (max(0, n_moe_layers - m) * per_layer + head)
        drain[i] = max(0.0, link_free - clock)
        total[i] = clock + drain[i]
    return copies, exposed, drain, total
