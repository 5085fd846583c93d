"""harness/accounting/clock.py: the compiled forward clock (`_clock`, through `forward_times`)
against the ledger's timeline written as a scalar loop over layers, op for op."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.accounting.clock import ForwardTimes, forward_times
from harness.accounting.cost import CostModel, HardwareConfig
from harness.accounting.pipeline import MissPipeline
from harness.model.config import LLaDA2Config
from tests.kernels.support import KERNEL, same_bits
from tests.kernels.test_pipeline_kernel import pipelined_layer_reference

TINY = LLaDA2Config(hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3)


class ScalarTimeline:
    """Test-only reference: one forward's clock as harness/accounting/ledger.py states it, a layer
    at a time. Each async copy's landing is kept by (row that issued it, position 1..):
    it lands at that row's link start + position x one copy."""

    def __init__(self, parts: tuple[float, float, float], n_moe_layers: int, copy_one: float, overlap: bool,
                 cpu_after_copies: bool = False) -> None:
        self.clock, self.per_layer, self.head = parts
        self.n_moe_layers, self.copy_one = n_moe_layers, copy_one
        self.overlap, self.cpu_after_copies = overlap, cpu_after_copies
        self.link_free, self.layers = 0.0, 0
        self.landing: dict[tuple[int, int], float] = {}

    def charge(self, gpu_s: float, cpu_s: float, n_sync: int, n_async: int, waits_for: tuple[int, int] | None = None,
               pipeline: tuple[float, list[float], int] | None = None) -> tuple[float, float]:
        """(exposed copy wait, exposed CPU time) of the next layer. waits_for: the async copy
        its GPU experts use; pipeline: (hits' GPU seconds, the misses' GPU seconds in load
        order, loads in flight) when its misses pipeline."""
        row = self.layers
        self.layers += 1
        self.clock = self.clock + self.per_layer
        t0 = ready = self.clock
        if n_sync and pipeline is None:  # sync copies queue on the link, FIFO, before the GPU experts
            self.link_free = max(t0, self.link_free) + n_sync * self.copy_one
            ready = self.link_free
        if waits_for is not None:
            ready = max(ready, self.landing[waits_for])
        if pipeline is None:
            gpu_end, copies = ready + gpu_s, ready - t0
        else:
            hit_s, miss_s, slots = pipeline
            gpu_end, link_after = pipelined_layer_reference(ready, max(t0, self.link_free), hit_s, miss_s,
                                                            self.copy_one, slots)
            if n_sync:
                self.link_free = link_after
            copies = gpu_end - gpu_s - t0
        start = max(t0, self.link_free)  # async copies queue after the sync ones
        for position in range(1, n_async + 1):
            self.landing[(row, position)] = start + position * self.copy_one
        if n_async:
            self.link_free = self.landing[(row, n_async)]
        cpu_start = ready if self.cpu_after_copies else t0
        end = max(gpu_end, cpu_start + cpu_s) if self.overlap else gpu_end + cpu_s
        self.clock = end
        return copies, end - gpu_end

    def finish(self) -> tuple[float, float]:
        """(total, drain): the layers that recorded nothing and the head, then the link's backlog."""
        self.clock = self.clock + (max(0, self.n_moe_layers - self.layers) * self.per_layer + self.head)
        drain = max(0.0, self.link_free - self.clock)
        return self.clock + drain, drain


def clock_reference(parts: np.ndarray, n_moe_layers: int, gpu_s: np.ndarray, cpu_s: np.ndarray, n_sync: np.ndarray,
                    n_async: np.ndarray, copy_one: float, overlap: bool, wait_row: np.ndarray,
                    wait_copies: np.ndarray, pipeline: MissPipeline | None, cpu_after_copies: bool) -> ForwardTimes:
    """Test-only reference: `forward_times` as one `ScalarTimeline` per forward."""
    n, m = gpu_s.shape
    copies, exposed, drain, total = np.empty((n, m)), np.empty((n, m)), np.empty(n), np.empty(n)
    for i in range(n):
        line = ScalarTimeline(tuple(parts[i]), n_moe_layers, copy_one, overlap, cpu_after_copies)
        for j in range(m):
            waits_for = (int(wait_row[i, j]), int(wait_copies[i, j])) if wait_copies[i, j] > 0 else None
            piped = None
            if pipeline is not None:
                loaded = np.flatnonzero(pipeline.to_load[i, j])  # ascending ids: the load order
                misses = [float(pipeline.table[pipeline.loads[i, j, e]]) for e in loaded]
                piped = (float(pipeline.hit_s[i, j]), misses, pipeline.slots)
            copies[i, j], exposed[i, j] = line.charge(float(gpu_s[i, j]), float(cpu_s[i, j]), int(n_sync[i, j]),
                                                      int(n_async[i, j]), waits_for, piped)
        total[i], drain[i] = line.finish()
    return ForwardTimes(copies, exposed, drain, total)


def assert_same_times(got: ForwardTimes, want: ForwardTimes) -> None:
    for name in ("copies_s", "cpu_exposed_s", "drain_s", "total_s"):
        assert same_bits(getattr(got, name), getattr(want, name)), name


@pytest.mark.parametrize("overlap", [True, False])
def test_forward_times_follow_the_scalar_timeline(overlap: bool) -> None:
    """Cost-model inputs: prefetches into the next layer, some outlasting the forward."""
    cost = CostModel(TINY, HardwareConfig())
    rng = np.random.default_rng(1)
    n, m, n_layers = 12, 5, 6  # a layer short: its slice is charged at the end
    gpu_s, cpu_s = rng.uniform(0, 1e-4, (n, m)), rng.uniform(0, 2e-4, (n, m))  # ~ copy_time(10)
    n_sync, n_prefetch = rng.integers(0, 3, (n, m)), rng.integers(0, 30, (n, m))
    n_prefetch[:, -1] = rng.integers(0, 80, n)  # the last layer's copies outlast some forwards
    used = rng.integers(0, 30, (n, m))  # the highest prefetched position each layer's GPU experts use
    parts = [cost.non_expert_breakdown(8 + s, 40 + s) for s in range(n)]
    split = np.array([(p.before_moe, p.per_moe_layer, p.head) for p in parts])
    copy_one = cost.copy_time(1)
    wait_row, wait_copies = np.zeros((n, m), np.int64), np.zeros((n, m), np.int64)
    for j in range(1, m):
        wait_row[:, j] = j - 1
        wait_copies[:, j] = np.where(used[:, j] < n_prefetch[:, j - 1], used[:, j] + 1, 0)
    times = forward_times(split, n_layers, gpu_s, cpu_s, n_sync, n_prefetch, copy_one, overlap, wait_row, wait_copies)
    assert times.drain_s.max() > 0 and times.copies_s.max() > 0  # async copies outlast some forwards
    assert (wait_copies > 0).sum() > 10  # prefetch waits are exercised
    want = clock_reference(split, n_layers, gpu_s, cpu_s, n_sync, n_prefetch, copy_one, overlap, wait_row,
                           wait_copies, None, False)
    assert_same_times(times, want)


def random_clock_inputs(rng: np.random.Generator, piped: bool) -> dict:
    """Forwards of any shape (none, no layers included), ties on a coarse grid or not, waits
    on any earlier row's async copies, and with `piped` a miss pipeline."""
    n, m, experts = int(rng.integers(0, 5)), int(rng.integers(0, 6)), int(rng.integers(0, 7))
    coarse = bool(rng.random() < 0.5)

    def times(*shape: int) -> np.ndarray:
        return rng.integers(0, 8, shape) * 0.25 if coarse else rng.uniform(0, 3, shape)

    n_async = rng.integers(0, 4, (n, m)) * (rng.random((n, m)) < 0.6)
    wait_row, wait_copies = np.zeros((n, m), np.int64), np.zeros((n, m), np.int64)
    for i in range(n):
        for j in range(m):
            rows = [r for r in range(j) if n_async[i, r] > 0]
            if rows and rng.random() < 0.6:
                wait_row[i, j] = rows[int(rng.integers(0, len(rows)))]
                wait_copies[i, j] = rng.integers(1, n_async[i, wait_row[i, j]] + 1)
    pipeline, n_sync = None, rng.integers(0, 3, (n, m))
    if piped:
        loads = rng.integers(0, 5, (n, m, experts))
        to_load = (loads > 0) & (rng.random((n, m, experts)) < 0.5)
        table = times(int(loads.max(initial=0)) + 1)
        pipeline = MissPipeline(int(rng.integers(1, 5)), times(n, m), loads, to_load, table)
        n_sync = to_load.sum(-1)
    return dict(parts=times(n, 3), n_moe_layers=max(0, m + int(rng.integers(-1, 3))), gpu_s=times(n, m),
                cpu_s=times(n, m), n_sync=n_sync, n_async=n_async, copy_one=float(times(1)[0]),
                overlap=bool(rng.random() < 0.5), wait_row=wait_row, wait_copies=wait_copies, pipeline=pipeline,
                cpu_after_copies=bool(rng.random() < 0.5))


@KERNEL
@given(seed=st.integers(0, 2**32 - 1), piped=st.booleans())
def test_the_clock_on_any_forwards(seed: int, piped: bool) -> None:
    inputs = random_clock_inputs(np.random.default_rng(seed), piped)
    assert_same_times(forward_times(**inputs), clock_reference(**inputs))
