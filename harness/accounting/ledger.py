"""The ledger: counters, the per-forward timeline and the step series, over arrays.

Every run keeps its accounts here, one way: a live run records each MoE layer's outcome
(`record_layer`: a few array writes) and the ledger charges its forwards in batches; a
replay whose system plans in batch hands whole chunks of forwards to `charge`; the CUDA
executor's engine is a live engine. Placement (which experts are resident, whether a plan
keeps the rules) is decided before anything reaches the ledger; the ledger only counts
and charges.

What a layer is charged (harness/accounting/cost.py has the model; harness/accounting/charge.py
applies the rule, for the ledger and for sensitivity's re-charge alike):

    routed pairs   sum of the layer's loads        missed pairs  loads of its missed experts
    cpu tokens     loads of its CPU experts        copies        sync, scratch, free, async
    gpu_s / cpu_s  the torch sum of the cost model's per-expert times, ascending ids
                   (given instead for topology=multi: the slowest GPU's time)

and the forward's clock runs through its layers in the order they were recorded:

    clock += the dense layers; then per layer: clock += its non-expert slice, t0 = clock
    sync copies queue on the PCIe link behind any async copies still in flight (one link,
    FIFO); the GPU experts start once the sync copies and any prefetched expert they use
    have landed: ready = max(t0, sync_done, landing of used prefetches)
    overlap (CPU runs concurrently):  end = max(ready + gpu, t0 + cpu)
    no overlap:                       end = ready + gpu + cpu
    pipelined misses (a system with max_loads_in_flight > 0, Mixtral-Offload): instead of
    ready + gpu, the resident GPU experts start at once and each missed one starts when
    its copy landed, with a bounded number of copies in flight (harness/accounting/pipeline.py)
    pageable host memory (hardware.host_memory=pageable): a copy is synchronous for the
    host, so every copy, async and prefetch included, is charged as a sync copy of the
    layer that issues it, nothing is pipelined, and CPU experts start after the copies
    (ready, not t0)
    async copies queue on the link after the sync copies; they cost time only when
    something waits for them: a later layer's GPU experts or sync copies, or the end of
    the forward (clock += skipped layers' slices + lm_head; clock = max(clock, link free)).

A prefetch landing is named by the row (layer of this forward) that issued the copy and
its position among that row's async copies: it lands at that row's link start + position
x one copy. The modeled time splits exactly into non-expert + exposed copy waits + GPU
experts + exposed CPU time; `cost_rows` keeps that split per forward (with the attention
part of the non-expert time, its tokens and context), harness/accounting/breakdown.py reports it.

Bits: every float is computed op for op as a scalar loop over layers would compute it,
vectorized over forwards only, and each counter adds its terms in forward-then-layer
order (harness/accounting/ordered_sums.py), so how forwards are batched never changes a result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from harness.accounting.breakdown import COST_COLUMNS
from harness.accounting.charge import Counters, add_charge, charge_prepared, prepare_outcomes
from harness.accounting.clock import ForwardTimes
from harness.accounting.cost import CostModel, NonExpertTime
from harness.accounting.outcomes import LayerOutcomes, OutcomeRecorder
from harness.accounting.phases import ForwardFigures, PhaseTallies, busy_shares, hit_rate, phase_measures
from harness.placement.steps import StepInfo

__all__ = ["LIVE_CHUNK", "BatchPlanner", "Counters", "LayerOutcomes", "Ledger"]  # the outcomes and counters it charges

LIVE_CHUNK = 64  # forwards a live run buffers before charging them together


class BatchPlanner(Protocol):
    """What a system decides for n forwards x every MoE layer at once (a replay)."""

    def plan(self, loads: np.ndarray, steps: list[StepInfo]) -> LayerOutcomes:
        """loads: int64 [n, L, E]; runs the system's per-forward work (`on_step`) too."""
        ...

    def residency(self) -> np.ndarray:
        """bool [L, E]: what the GPU holds after the forwards planned so far."""
        ...



def _cost_rows(sizes: list[tuple[int, int]], parts: list[NonExpertTime], gpu_s: np.ndarray,
               times: ForwardTimes) -> np.ndarray:
    """One row per forward in COST_COLUMNS order: tokens, context, attention, the rest of the
    non-expert time, GPU experts, exposed copy waits (the link's drain at the forward's end
    included), exposed CPU time."""
    n = len(sizes)
    non_expert = np.array([p.total for p in parts], np.float64)
    attention = np.array([p.attention_total for p in parts], np.float64)
    rows = np.empty((n, len(COST_COLUMNS)))
    rows[:, 0:2] = np.array(sizes, np.float64).reshape(n, 2)
    rows[:, 2] = attention
    rows[:, 3] = non_expert - attention
    rows[:, 4] = np.asarray(gpu_s, np.float64).reshape(n, -1).sum(1)
    rows[:, 5] = times.copies_s.sum(1) + times.drain_s
    rows[:, 6] = times.cpu_exposed_s.sum(1)
    return rows


@dataclass
class _LiveForward:
    step: StepInfo
    size: tuple[int, int]
    counts: list[tuple[int, int, int, int, int, int, float]] = field(default_factory=list)


class Ledger:
    """The accounts of one run: counters, step series, and the live forwards recorded but
    not charged yet (charged in batches of LIVE_CHUNK, and whenever they are read)."""

    def __init__(self, cost: CostModel, n_layers: int, n_experts: int, overlap: bool, pipeline_slots: int = 0,
                 recorder: OutcomeRecorder | None = None) -> None:
        self.cost, self.n_layers, self.n_experts, self.overlap = cost, n_layers, n_experts, overlap
        # > 0: misses load while GPU experts compute (harness/accounting/pipeline.py)
        self.pipeline_slots = pipeline_slots
        # keeps every closed batch charged, to be charged again under other cost tables
        # (the sensitivity analysis: docs/sensitivity.md); set it before the first forward
        self.recorder = recorder
        self.counters = Counters()
        self._series: list[dict[str, Any]] = []
        self._notes: dict[int, dict[str, Any]] = {}  # forward index -> figures added to its step
        self._breakdowns: dict[tuple[int, int], NonExpertTime] = {}
        self._cost_rows: list[np.ndarray] = []  # per charged forward: COST_COLUMNS (the cost breakdown)
        # live forwards: rows written in place, charged together
        self._closed: list[_LiveForward] = []
        self._open: _LiveForward | None = None
        self._rows = n_layers
        self._alloc(LIVE_CHUNK + 1, n_layers)
        self.phases: PhaseTallies | None = None  # per-kind accounts, kept for DALI's measures only

    def track_phases(self) -> None:
        """Keep per-phase accounts from now on (harness/accounting/phases.py); call before
        the first forward."""
        if self.forwards:
            raise RuntimeError("track_phases after forwards were recorded")
        self.phases = PhaseTallies()

    def _alloc(self, forwards: int, rows: int) -> None:
        self._loads = np.zeros((forwards, rows, self.n_experts), np.int64)
        self._gpu = np.zeros((forwards, rows, self.n_experts), bool)
        self._missed = np.zeros((forwards, rows, self.n_experts), bool)

    # ---- live: one layer at a time ----------------------------------------------------
    def begin_forward(self, step: StepInfo, n_tokens: int, n_context: int) -> None:
        if self._open is not None:
            self.end_forward()
        self._open = _LiveForward(step, (n_tokens, n_context))

    def record_layer(self, loads: np.ndarray, gpu_mask: np.ndarray, missed: np.ndarray, copies_sync: int,
                     copies_scratch: int, copies_free: int, copies_async: int, wait: tuple[int, int] = (0, 0),
                     gpu_s: float = float("nan")) -> None:
        """One layer of the open forward: its loads, the experts computed on the GPU (a
        bool mask; the other routed ones run on the CPU), the routed experts that missed (a
        bool mask),
        its copies, what its GPU experts wait for (row, copies) and, for topology=multi,
        its GPU seconds."""
        forward = self._open
        if forward is None:
            raise RuntimeError("record_layer outside begin_forward/end_forward")
        f, j = len(self._closed), len(forward.counts)
        if j >= self._rows:  # more layers than the model has: room for them
            self._grow(j + 1)
        self._loads[f, j] = loads
        self._gpu[f, j] = gpu_mask
        self._missed[f, j] = missed
        forward.counts.append((copies_sync, copies_scratch, copies_free, copies_async, *wait, gpu_s))

    def _grow(self, rows: int) -> None:
        old = (self._loads, self._gpu, self._missed)
        self._rows = rows
        self._alloc(old[0].shape[0], rows)
        for new, was in zip((self._loads, self._gpu, self._missed), old, strict=True):
            new[:, : was.shape[1]] = was

    def end_forward(self) -> None:
        if self._open is None:
            return
        self._closed.append(self._open)
        self._open = None
        if len(self._closed) >= LIVE_CHUNK:
            self.flush()

    def note_last_forward(self, **figures: Any) -> None:
        """Add figures (a measured run's timings) to the last closed forward's step."""
        index = len(self._series) + len(self._closed) - 1
        if index < len(self._series):  # already charged
            self._series[index].update(figures)
        else:
            self._notes[index] = figures

    def flush(self) -> None:
        """Charge the closed live forwards, in order, in runs of equal layer counts."""
        closed, self._closed = self._closed, []
        first = 0
        while first < len(closed):
            m = len(closed[first].counts)
            last = first
            while last < len(closed) and len(closed[last].counts) == m:
                last += 1
            self._charge_live(closed[first:last], first, m)
            first = last

    def counters_now(self) -> Counters:
        """The counters with every recorded layer charged, the open forward's too (as far
        as it went: not its end, so no step for it and no drain of its link)."""
        self.flush()
        if self._open is None:
            return self.counters
        kept, series = self.counters, self._series
        self.counters, self._series = replace(kept), []
        try:
            self._charge_live([self._open], 0, len(self._open.counts), closed=False)
            return self.counters
        finally:
            self.counters, self._series = kept, series

    def _charge_live(self, forwards: list[_LiveForward], first: int, m: int, closed: bool = True) -> None:
        counts = np.array([fw.counts for fw in forwards], np.float64).reshape(len(forwards), m, 7)
        ints = counts[..., :6].astype(np.int64)
        rows = slice(first, first + len(forwards))
        outcome = LayerOutcomes(
            self._loads[rows, :m], self._gpu[rows, :m], self._missed[rows, :m], ints[..., 0], ints[..., 1],
            ints[..., 3], copies_free=ints[..., 2], wait_row=ints[..., 4], wait_copies=ints[..., 5],
            gpu_s=None if np.isnan(counts[..., 6]).all() else counts[..., 6],
        )
        self.charge([fw.step for fw in forwards], [fw.size for fw in forwards], outcome, closed)

    # ---- a batch of forwards ----------------------------------------------------------
    def breakdown(self, n_tokens: int, n_context: int) -> NonExpertTime:
        size = (n_tokens, n_context)
        if size not in self._breakdowns:
            self._breakdowns[size] = self.cost.non_expert_breakdown(*size)
        return self._breakdowns[size]

    def charge(self, steps: list[StepInfo], sizes: list[tuple[int, int]], out: LayerOutcomes,
               closed: bool = True) -> None:
        """Charge n forwards (their steps, (tokens, context) and layer outcomes), in order, by
        the charge rule of harness/accounting/charge.py; closed=False: forwards still open,
        charged up to their last recorded layer (and neither recorded nor in the series)."""
        prepared = prepare_outcomes(out, self.pipeline_slots)
        charged = charge_prepared(prepared, self.cost, sizes, self.n_layers, self.overlap, self.breakdown)
        add_charge(self.counters, prepared, charged, closed)
        if not closed:
            return
        tally, times = prepared.tally, charged.times
        self._append_steps(steps, tally.routed.sum(-1).tolist(), tally.missed.sum(-1).tolist(),
                           times.total_s.tolist())
        self._cost_rows.append(_cost_rows(sizes, charged.parts, charged.gpu_s, times))
        if self.phases is not None:
            self.phases.add(ForwardFigures(
                [step.kind for step in steps], times.total_s, charged.gpu_s, charged.cpu_s, charged.non_expert_s,
                charged.copies_busy_s, (tally.n_gpu + tally.n_cpu).sum(-1), np.count_nonzero(out.missed, axis=(1, 2))))
        if self.recorder is not None:
            self.recorder.add(steps, sizes, out)

    def _append_steps(self, steps: list[StepInfo], routed: list[int], missed: list[int], totals: list[float]) -> None:
        for i, step in enumerate(steps):
            entry = {
                "global_step": step.global_step, "prompt": step.prompt, "kind": step.kind, "block": step.block,
                "step": step.step, "routed_pairs": routed[i], "missed_pairs": missed[i],
                "miss_rate": missed[i] / routed[i] if routed[i] else 0.0, "modeled_latency_s": totals[i],
            }
            entry.update(self._notes.pop(len(self._series), {}))
            self._series.append(entry)

    # ---- results ----------------------------------------------------------------------
    @property
    def forwards(self) -> int:
        return len(self._series) + len(self._closed)

    def step_series(self) -> list[dict[str, Any]]:
        self.flush()
        return self._series

    def cost_rows(self) -> np.ndarray:
        """float [forwards, len(COST_COLUMNS)]: each charged forward's tokens, context and
        modeled seconds split by component (harness/accounting/breakdown.py); its components add
        up to the step's modeled_latency_s (to rounding: the clock adds them in another order)."""
        self.flush()
        if not self._cost_rows:
            return np.zeros((0, len(COST_COLUMNS)))
        if len(self._cost_rows) > 1:
            self._cost_rows = [np.concatenate(self._cost_rows)]
        return self._cost_rows[0]

    def measures(self) -> dict[str, float]:
        """DALI's busy shares and expert hit rate, for the run and per phase (empty unless
        `track_phases` was called; harness/accounting/phases.py)."""
        if self.phases is None:
            return {}
        c = self.counters_now()
        self.flush()
        modeled = c.modeled_time_s
        return {**busy_shares(c.time_gpu_experts_s, c.busy_cpu_experts_s, c.time_non_expert_s, c.busy_copies_s,
                              modeled),
                **hit_rate(*self.phases.routed_and_missed()), **phase_measures(self.phases)}

    def figures(self) -> dict[str, Any]:
        """The run's accounts as a summary's figures: counters, I/O, modeled time, steps."""
        c = self.counters_now()
        step_series = self.step_series()
        copies = c.copies_sync + c.copies_async + c.copies_scratch
        io_bytes = int(copies * self.cost.expert_bytes)
        modeled = c.modeled_time_s
        return {
            "forwards": len(step_series),
            "routed_pairs": c.routed_pairs,
            "missed_pairs": c.missed_pairs,
            "miss_rate": c.missed_pairs / c.routed_pairs if c.routed_pairs else 0.0,
            "io_bytes": io_bytes,
            "io_gb": io_bytes / 1e9,
            "cpu_expert_tokens": c.cpu_expert_tokens,
            "copies_sync": c.copies_sync,
            "copies_async": c.copies_async,
            "copies_scratch": c.copies_scratch,
            "copies_free": c.copies_free,
            "time_gpu_experts_s": c.time_gpu_experts_s,
            "time_cpu_experts_s": c.time_cpu_experts_s,
            "time_copies_s": c.time_copies_s,
            "time_non_expert_s": c.time_non_expert_s,
            "busy_cpu_experts_s": c.busy_cpu_experts_s,
            "busy_copies_s": c.busy_copies_s,
            "modeled_time_s": modeled,
            "step_series": list(step_series),
        }
