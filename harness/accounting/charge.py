"""The ledger's charge rule, written once: a batch of forwards' outcomes is first prepared
(`prepare_outcomes`: everything that no cost table changes: the per-layer tallies, which
loads each layer's GPU and CPU experts have, the copies each layer issues), then charged
under a cost table (`charge_prepared`: expert and non-expert seconds, the forward clock),
and the charge is added to the run's counters (`add_charge`: the running sums).

`Ledger.charge` (harness/accounting/ledger.py, which states the rules) runs the three on
every batch it charges; the sensitivity analysis's re-charge (harness/sensitivity/recharge.py,
docs/sensitivity.md) prepares a whole replay's outcomes once, with `reuse=True` (each
layer's loads regrouped once, so that each further cost table is one gather and the ordered
sums), and charges them under many cost tables into fresh counters. Both compute every float
in the same order, and the ledger's batching never changes a sum
(harness/accounting/ordered_sums.py), so a re-charge gives a full replay's figures to the
bit (tests/unit/test_sensitivity.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.accounting.clock import ForwardTimes, forward_times
from harness.accounting.cost import CostModel, NonExpertTime
from harness.accounting.ordered_sums import RowSums, constant_row_sums, running_sum, table_row_sums
from harness.accounting.outcomes import LayerOutcomes
from harness.accounting.pipeline import MissPipeline
from harness.accounting.tallies import LayerTallies, layer_tallies

KEPT = 4  # cost tables whose sums a reused `ExpertRuns` keeps ([forwards, layers] each: ~1 MB at gen 1024)


@dataclass
class Counters:
    routed_pairs: int = 0
    missed_pairs: int = 0
    cpu_expert_tokens: int = 0
    copies_sync: int = 0
    copies_async: int = 0
    copies_scratch: int = 0
    copies_free: int = 0
    time_gpu_experts_s: float = 0.0
    time_cpu_experts_s: float = 0.0
    time_copies_s: float = 0.0
    time_non_expert_s: float = 0.0
    busy_cpu_experts_s: float = 0.0
    busy_copies_s: float = 0.0

    @property
    def modeled_time_s(self) -> float:
        """The run's modeled seconds: GPU experts + exposed CPU + exposed copies + non-expert."""
        return self.time_gpu_experts_s + self.time_cpu_experts_s + self.time_copies_s + self.time_non_expert_s


class ExpertRuns:
    """The loads of one set of experts per layer (a bool mask [n, m, E], or a function that
    builds it when it is needed) and, for a cost table, each layer's seconds: the torch sum
    of table[load] over its experts in ascending id order (`table_row_sums`).

    reuse=False: each table is summed from the loads (one charge). reuse=True: the loads are
    picked and regrouped by row length once and the sums of the last KEPT tables kept (many
    charges of the same outcomes); the sums are the same bits either way."""

    def __init__(self, loads: np.ndarray, mask: np.ndarray | Callable[[], np.ndarray], lengths: np.ndarray,
                 top: int, reuse: bool = False) -> None:
        self.loads, self.mask, self.lengths, self.top, self.reuse = loads, mask, lengths, top, reuse
        self._sums: RowSums | None = None
        self._kept: dict[bytes, np.ndarray] = {}  # by the table's values: a profile that changes another part reuses
        if reuse:
            # row-major: each row's experts in id order (a load is a token count: int16 where it
            # fits, as memory adds up and a narrow index gathers faster)
            picked = np.extract(mask() if callable(mask) else mask, loads)
            self.picked = picked.astype(np.int16 if top < 2**15 else np.int32)
            self.mask = None  # not kept: the picked loads are all a re-charge needs

    def seconds(self, table: np.ndarray) -> np.ndarray:
        """float [n, m]: each layer's seconds under `table` (a cost model's `time_table`)."""
        if not self.reuse:
            assert self.mask is not None
            return table_row_sums(table, self.loads, self.mask, self.lengths, self.top)
        key = table[: self.top + 1].tobytes()
        if key not in self._kept:
            if len(self._kept) >= KEPT:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = self._grouped_seconds(table)
        return self._kept[key]

    def _grouped_seconds(self, table: np.ndarray) -> np.ndarray:
        top, shape = self.top, self.lengths.shape
        if top >= 1 and (table[1 : top + 1] == table[1]).all():
            return constant_row_sums(float(table[1]), self.lengths.ravel()).reshape(shape)
        if self._sums is None:  # regrouped once: then each table is one gather and the sums
            self._sums = RowSums(self.lengths.ravel())
            self.picked = self._sums.grouped(self.picked)
        return self._sums.grouped_sums(table[self.picked]).reshape(shape)


@dataclass
class PreparedOutcomes:
    """A batch of forwards' outcomes with what their charge needs that no cost table changes."""

    out: LayerOutcomes
    tally: LayerTallies
    gpu: ExpertRuns  # the GPU experts' loads (unused when the outcomes give their GPU seconds)
    cpu: ExpertRuns  # the CPU experts' loads
    hits: ExpertRuns | None  # pipelined misses: the resident GPU experts' loads
    n_sync: np.ndarray  # [n, m] copies that block the layer: sync and scratch
    pipeline_slots: int


def prepare_outcomes(out: LayerOutcomes, pipeline_slots: int = 0, reuse: bool = False) -> PreparedOutcomes:
    """The cost-free part of charging `out`; pipeline_slots > 0: misses load while the GPU
    experts compute (harness/accounting/pipeline.py), and every sync copy must then be a
    missed GPU expert's."""
    loads = out.loads
    tally = layer_tallies(loads, out.on_gpu, out.missed)
    n_sync = out.copies_scratch + out.copies_sync
    hits = None
    if pipeline_slots > 0:
        if not np.array_equal(tally.n_to_load, n_sync):
            raise RuntimeError("a pipelined layer copies other experts than its missed GPU experts")
        hits = ExpertRuns(loads, lambda: out.on_gpu & ~out.missed, tally.n_hit, tally.top, reuse)
    gpu = ExpertRuns(loads, out.on_gpu, tally.n_gpu, tally.top, reuse and out.gpu_s is None)
    cpu = ExpertRuns(loads, lambda: (loads > 0) & ~out.on_gpu, tally.n_cpu, tally.top, reuse)
    return PreparedOutcomes(out, tally, gpu, cpu, hits, n_sync, pipeline_slots)


@dataclass
class ForwardCharge:
    """What a batch of n forwards (m layers each) is charged under one cost table."""

    gpu_s: np.ndarray  # [n, m] GPU experts' seconds
    cpu_s: np.ndarray  # [n, m] CPU experts' seconds (busy, exposed or not)
    parts: list[NonExpertTime]  # per forward
    non_expert_s: np.ndarray  # [n]
    copies_busy_s: np.ndarray  # [n, m] the link's busy seconds
    times: ForwardTimes  # the clock


def charge_prepared(prepared: PreparedOutcomes, cost: CostModel, sizes: list[tuple[int, int]], n_layers: int,
                    overlap: bool, breakdown: Callable[[int, int], NonExpertTime] | None = None) -> ForwardCharge:
    """The charge of prepared outcomes under `cost` (harness/accounting/ledger.py states the
    rules); sizes: each forward's (tokens, context); breakdown: the non-expert time of a size
    (default: the cost model's, once per distinct size)."""
    out, top = prepared.out, prepared.tally.top
    gpu_table = cost.time_table("gpu", top)
    gpu_s = out.gpu_s if out.gpu_s is not None else prepared.gpu.seconds(gpu_table)  # given: topology=multi
    cpu_s = prepared.cpu.seconds(cost.time_table("cpu", top))
    if breakdown is None:
        memo = {size: cost.non_expert_breakdown(*size) for size in dict.fromkeys(sizes)}
        parts = [memo[size] for size in sizes]
    else:
        parts = [breakdown(*size) for size in sizes]
    split = np.array([(p.before_moe, p.per_moe_layer, p.head) for p in parts], np.float64).reshape(-1, 3)
    n_sync = prepared.n_sync
    copy_one = cost.copy_time(1)
    if cost.pageable:  # every copy blocks the host: charged where it is issued, nothing in flight
        blocking = n_sync + out.copies_async
        times = forward_times(split, n_layers, gpu_s, cpu_s, blocking, np.zeros_like(blocking), copy_one, overlap,
                              cpu_after_copies=True)
    else:
        pipeline = None
        if prepared.hits is not None:
            pipeline = MissPipeline(prepared.pipeline_slots, prepared.hits.seconds(gpu_table), out.loads,
                                    out.on_gpu & out.missed, gpu_table)
        times = forward_times(split, n_layers, gpu_s, cpu_s, n_sync, out.copies_async, copy_one, overlap,
                              out.wait_row, out.wait_copies, pipeline)
    non_expert_s = np.array([p.total for p in parts])
    return ForwardCharge(gpu_s, cpu_s, parts, non_expert_s, (n_sync + out.copies_async) * copy_one, times)


def add_charge(counters: Counters, prepared: PreparedOutcomes, charged: ForwardCharge, closed: bool = True) -> None:
    """Add a charged batch to the counters, each sum in forward-then-layer order; closed=False:
    forwards still open (their link's drain at the forward's end is not charged yet)."""
    c, out, tally, times = counters, prepared.out, prepared.tally, charged.times
    c.routed_pairs += int(tally.routed.sum())
    c.missed_pairs += int(tally.missed.sum())
    c.cpu_expert_tokens += int(tally.cpu_tokens.sum())
    c.copies_sync += int(out.copies_sync.sum())
    c.copies_scratch += int(out.copies_scratch.sum())
    c.copies_async += int(out.copies_async.sum())
    c.copies_free += int(out.copies_free.sum()) if out.copies_free is not None else 0
    c.time_non_expert_s = running_sum(c.time_non_expert_s, charged.non_expert_s)
    waits = np.concatenate([times.copies_s, times.drain_s[:, None]], 1) if closed else times.copies_s
    c.time_gpu_experts_s = running_sum(c.time_gpu_experts_s, charged.gpu_s)
    c.time_cpu_experts_s = running_sum(c.time_cpu_experts_s, times.cpu_exposed_s)
    c.time_copies_s = running_sum(c.time_copies_s, waits)
    c.busy_cpu_experts_s = running_sum(c.busy_cpu_experts_s, charged.cpu_s)
    c.busy_copies_s = running_sum(c.busy_copies_s, charged.copies_busy_s)
