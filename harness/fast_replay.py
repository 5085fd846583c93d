"""Vectorized replay of fiddler and tide: `OffloadEngine.replay`'s summary, ~100x faster.

`replay_fast_or_exact(engine, trace)` is what replays call: the fast path when the
engine's system is exactly `Fiddler` or `Tide` (any tau, either migration), on one GPU,
recording no trace and with no forward open; `engine.replay` otherwise. Either way the
engine ends as the replay leaves it (counters, step series, residency), so
`engine.summary()` and the system's `report()` read the same.

Why it is exact. Decisions come from the systems' own code: `Tide.on_step` runs for every
forward (refresh flags, tau draws, the refresh count); Fiddler's per-miss rule is read by
probing `Fiddler.plan` once with every load value in the trace (the rule is elementwise in
the load); tide's refresh is `refresh_residency` on packed rows, a twin tested against it
(harness/fast_replay_ops.py). Expert times are the cost model's own vector functions
tabulated per load. Each layer's GPU (CPU) seconds are summed as the engine sums them, a
torch sum over the same values in the same order; the timeline is
`ForwardTimeline.charge_layer` op for op over a vector of forwards (each starts with an
idle link); each counter adds in the engine's order. So the summary is bit for bit the
engine's (the tests ask for 1e-9 relative on times, in case a torch build differs).

Layout, per chunk of forwards: each expert gets a code, load * C + a small class (is it
resident, does it compute on the GPU); one bincount of the codes per (forward, layer) row
gives every count. Fiddler's classes are static; tide carries residency forward by forward
as packed [L, words] rows (a refresh is ~15 tiny integer ops), then classes are unpacked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from harness.cost import NonExpertTime
from harness.engine import OffloadEngine
from harness.fast_replay_ops import (
    as_mask,
    constant_row_sums,
    pack,
    popcount,
    refresh_bits,
    running_sum,
    top_b,
    torch_row_sums,
    unpack,
)
from harness.trace import RoutingTrace
from systems.fiddler import Fiddler
from systems.tide import Tide

CHUNK_ELEMENTS = 1 << 20  # bincount entries per chunk of forwards: bounds memory, keeps ops large


class ReplayOutcome(NamedTuple):
    summary: dict[str, Any]
    mode: str  # "fast" | "engine"


def replay_fast_or_exact(engine: OffloadEngine, trace: RoutingTrace, allow_fast: bool = True) -> ReplayOutcome:
    """Replay `trace` through `engine`: vectorized when supported, else the engine itself."""
    if allow_fast and fast_path_refusal(engine, trace) is None:
        return ReplayOutcome(fast_replay(engine, trace), "fast")
    return ReplayOutcome(engine.replay(trace), "engine")


def fast_path_refusal(engine: OffloadEngine, trace: RoutingTrace) -> str | None:
    """Why the fast path cannot stand in for `engine.replay(trace)`; None when it can."""
    if type(engine.system) not in (Fiddler, Tide):  # a subclass may change any decision
        return f"system {engine.system.name!r} has no fast replay"
    if engine.topology.multi:
        return "topology=multi"
    if engine.trace is not None:
        return "the engine is recording a trace"
    if not engine._prepared or engine._timeline is not None:  # let the engine raise its own error
        return "the engine is not prepared, or has a forward open"
    if (trace.n_layers, trace.n_experts) != (engine.n_layers, engine.n_experts):
        return "the trace's geometry differs from the engine's"
    return None


# ---- the systems' plans for a chunk of forwards -------------------------------------
@dataclass
class ChunkPlan:
    """n forwards x L layers of plans: a small class per expert, and tables [load, class]
    saying whether a routed expert computes on the GPU (else the CPU), was resident when
    its layer started (else it is a miss), and is a one-use scratch copy (sync, uncached)."""

    classes: np.ndarray  # uint8 [n, L, E], or a shape that broadcasts to it
    on_gpu: np.ndarray  # bool [V, C]
    resident: np.ndarray  # bool [V, C]
    scratch: np.ndarray  # bool [V, C]
    cached_sync: np.ndarray  # int [n, L]: sync copies that stay resident
    n_async: np.ndarray  # int [n, L]


class FiddlerPlanner:
    """Static placement: the class is 'resident'; a miss's device depends only on its load."""

    def __init__(self, engine: OffloadEngine, n_values: int) -> None:
        self.classes = as_mask(engine.resident, engine.n_experts).astype(np.uint8)
        # the rule read from plan itself: with nothing resident every routed expert is a miss,
        # and expert v (load v) goes to the CPU exactly when any miss of load v does
        to_cpu = engine.system.plan(0, torch.arange(n_values), None, frozenset()).cpu.numpy()
        routed = np.arange(n_values) > 0
        self.on_gpu = np.stack([routed & ~to_cpu, np.ones(n_values, bool)], axis=1)
        self.resident = np.stack([np.zeros(n_values, bool), np.ones(n_values, bool)], axis=1)
        self.scratch = self.on_gpu & ~self.resident & routed[:, None]

    def plan(self, loads: np.ndarray, steps: range) -> ChunkPlan:
        zeros = np.zeros(loads.shape[:2], np.int64)
        return ChunkPlan(self.classes, self.on_gpu, self.resident, self.scratch, zeros, zeros)

    def finish(self, engine: OffloadEngine) -> None:
        pass  # placement never changes


class TidePlanner:
    """Residency carried forward by forward in packed rows; class = 2 * on GPU + resident."""

    def __init__(self, engine: OffloadEngine, trace: RoutingTrace, n_values: int) -> None:
        self.system: Tide = engine.system  # type: ignore[assignment]
        self.steps, self.n_experts = trace.steps, engine.n_experts
        self.resident = pack(as_mask(engine.resident, engine.n_experts))
        classes = np.arange(4)
        self.tables = (np.broadcast_to(classes >= 2, (n_values, 4)), np.broadcast_to(classes % 2 == 1, (n_values, 4)),
                       np.zeros((n_values, 4), bool))

    def plan(self, loads: np.ndarray, steps: range) -> ChunkPlan:
        system, capacity = self.system, self.system.capacity
        refreshing = np.zeros(len(steps), bool)
        for i, s in enumerate(steps):  # the system's own schedule: tau draws, refresh count
            system.on_step(self.steps[s])
            refreshing[i] = system.refreshing
        targets = np.zeros((len(steps), *self.resident.shape), np.uint64)
        if refreshing.any():
            targets[refreshing] = pack(top_b(loads[refreshing], capacity))
        n_target = popcount(targets)
        # held[i]: residency when forward i starts; held[i + 1]: after its refresh, if any
        held = np.empty((len(steps) + 1, *self.resident.shape), np.uint64)
        held[0] = self.resident
        for i in range(len(steps)):
            held[i + 1] = held[i]
            if refreshing[i]:
                held[i + 1] = refresh_bits(held[i], targets[i], n_target[i], capacity, self.n_experts)
        self.resident = held[-1].copy()
        start, after = held[:-1], held[1:]
        promoted = popcount(after & ~start)
        system.migrated += int(promoted.sum())
        sync = system.migration == "sync"
        # sync: promotions land before the layer computes and serve it; async: they land in
        # the background, so only experts resident before and after serve on the GPU
        classes = unpack(after if sync else after & start, self.n_experts)
        classes <<= 1
        classes |= unpack(start, self.n_experts)
        zeros = np.zeros_like(promoted)
        return ChunkPlan(classes, *self.tables, promoted if sync else zeros, zeros if sync else promoted)

    def finish(self, engine: OffloadEngine) -> None:
        engine.resident = [set(np.flatnonzero(row).tolist()) for row in unpack(self.resident, self.n_experts)]


# ---- figures per (forward, layer) and the forward timeline ---------------------------
COUNTS = ("routed", "missed", "cpu_tokens", "scratch", "gpu_experts", "cpu_experts")


@dataclass
class CodeTables:
    """Per expert code load * C + class: what it adds to each count, and where it computes."""

    counts: np.ndarray  # float64 [V * C, len(COUNTS)] (integers: exact through a float matmul)
    device: np.ndarray  # uint8 [V * C]: 0 not routed, 1 GPU, 2 CPU
    gpu_s: np.ndarray  # float64 [V * C]: the cost model's time of one such expert
    cpu_s: np.ndarray


def code_tables(plan: ChunkPlan, gpu_table: np.ndarray, cpu_table: np.ndarray) -> CodeTables:
    shape = plan.on_gpu.shape
    load = np.broadcast_to(np.arange(shape[0])[:, None], shape)
    on_gpu, on_cpu = plan.on_gpu & (load > 0), ~plan.on_gpu & (load > 0)
    columns = [load, load * ~plan.resident, load * on_cpu, plan.scratch & (load > 0), on_gpu, on_cpu]
    return CodeTables(np.stack([np.asarray(c, np.float64).ravel() for c in columns], axis=1),
                      (on_gpu + 2 * on_cpu).astype(np.uint8).ravel(),
                      np.broadcast_to(gpu_table[:, None], shape).ravel(),
                      np.broadcast_to(cpu_table[:, None], shape).ravel())


def row_figures(loads: np.ndarray, plan: ChunkPlan, tables: CodeTables) -> dict[str, np.ndarray]:
    """Every figure per (forward, layer). Counts: one bincount of each row's experts per
    code, weighed by the tables. Seconds: the engine sums the times of a layer's GPU (CPU)
    experts as one torch tensor in id order, so the same runs are summed the same way."""
    n, n_layers, _ = loads.shape
    n_rows, width = n * n_layers, tables.counts.shape[0]
    wide = np.int64 if n_rows * width >= 2**31 else np.int32  # int32 keeps the passes light
    rows = loads.astype(wide, copy=False) * wide(plan.on_gpu.shape[1])
    rows += plan.classes
    base = (np.arange(n_rows, dtype=wide) * width).reshape(n, n_layers, 1)
    rows += base
    counts = np.bincount(rows.ravel(), minlength=n_rows * width).reshape(n_rows, width)
    values = np.rint(counts.astype(np.float64) @ tables.counts).astype(np.int64).reshape(n, n_layers, len(COUNTS))
    out = {name: values[..., i] for i, name in enumerate(COUNTS)}
    present = counts.sum(0) > 0
    code = None
    for name, which, times in (("gpu", 1, tables.gpu_s), ("cpu", 2, tables.cpu_s)):
        lengths = out[f"{name}_experts"].ravel()
        costs = np.unique(times[present & (tables.device == which)])
        if costs.size <= 1:  # one cost for every such expert: a row's sum depends on its length only
            sums = constant_row_sums(float(costs[0]) if costs.size else 0.0, lengths)
        else:
            code = (rows - base).ravel() if code is None else code  # load * C + class
            picked = np.compress(tables.device[code] == which, code)  # row-major: each row's experts in id order
            sums = torch_row_sums(times[picked], lengths)
        out[f"{name}_s"] = sums.reshape(n, n_layers)
    return out


@dataclass
class ForwardTimes:
    copies_s: np.ndarray  # [n, L] exposed copy waits
    cpu_exposed_s: np.ndarray  # [n, L] CPU time past the GPU path
    drain_s: np.ndarray  # [n] async copies still on the link when the forward ends
    total_s: np.ndarray  # [n] the forward's modeled seconds


def forward_times(parts: np.ndarray, gpu_s: np.ndarray, cpu_s: np.ndarray, n_sync: np.ndarray,
                  n_async: np.ndarray, copy_one: float, overlap: bool) -> ForwardTimes:
    """ForwardTimeline.charge_layer for every layer then finish(), over n forwards at once.

    parts: [n, 3] non-expert seconds (before the MoE layers, per MoE layer, head). Valid
    for plans whose async copies go into their own layer: a layer pops its landings before
    issuing and is charged once per forward, so landings never delay a GPU start."""
    n, n_layers = gpu_s.shape
    clock, per_layer, head = parts[:, 0].copy(), parts[:, 1], parts[:, 2]
    link_free = np.zeros(n)
    copies, exposed = np.empty((n, n_layers)), np.empty((n, n_layers))
    for layer in range(n_layers):
        clock = clock + per_layer
        t0 = clock
        has_sync, has_async = n_sync[:, layer] > 0, n_async[:, layer] > 0
        link_free = np.where(has_sync, np.maximum(t0, link_free) + n_sync[:, layer] * copy_one, link_free)
        ready = np.where(has_sync, link_free, t0)
        start = np.maximum(t0, link_free)
        link_free = np.where(has_async, start + n_async[:, layer] * copy_one, link_free)
        gpu_end = ready + gpu_s[:, layer]
        end = np.maximum(gpu_end, t0 + cpu_s[:, layer]) if overlap else gpu_end + cpu_s[:, layer]
        copies[:, layer] = ready - t0
        exposed[:, layer] = end - gpu_end
        clock = end
    clock = clock + head
    drain = np.maximum(0.0, link_free - clock)
    return ForwardTimes(copies, exposed, drain, clock + drain)


# ---- the replay ----------------------------------------------------------------------
def fast_replay(engine: OffloadEngine, trace: RoutingTrace) -> dict[str, Any]:
    """`engine.replay(trace)` for a supported engine (see `fast_path_refusal`)."""
    refusal = fast_path_refusal(engine, trace)
    if refusal is not None:
        raise ValueError(f"no fast replay: {refusal}")
    return FastReplay(engine, trace).run()


class FastReplay:
    def __init__(self, engine: OffloadEngine, trace: RoutingTrace) -> None:
        self.engine, self.trace = engine, trace
        self.loads = trace.loads.numpy()
        if self.loads.size and int(self.loads.min()) < 0:  # loads index the cost tables
            raise ValueError("the trace holds negative expert loads")
        n_values = (int(self.loads.max()) if self.loads.size else 0) + 1
        self.planner = TidePlanner(engine, trace, n_values) if isinstance(engine.system, Tide) \
            else FiddlerPlanner(engine, n_values)
        counts = torch.arange(n_values)  # the engine's own vector functions, once per load
        self.gpu_table = engine.cost.gpu_expert_times(counts).numpy()
        self.cpu_table = engine.cost.cpu_expert_times(counts).numpy()
        self.chunk = max(1, CHUNK_ELEMENTS // max(1, engine.n_layers * max(engine.n_experts, 4 * n_values)))
        self.breakdowns: dict[tuple[int, int], NonExpertTime] = {}

    def run(self) -> dict[str, Any]:
        tables = None
        for first in range(0, len(self.loads), self.chunk):
            steps = range(first, min(first + self.chunk, len(self.loads)))
            loads = self.loads[first : steps.stop]
            plan = self.planner.plan(loads, steps)
            if tables is None:  # the same for every chunk
                tables = code_tables(plan, self.gpu_table, self.cpu_table)
            self.charge(steps, loads, plan, tables)
        self.planner.finish(self.engine)
        return self.engine.summary()

    def non_expert(self, steps: range, routed: np.ndarray) -> list[NonExpertTime]:
        """Each forward's non-expert time, with the tokens and context OffloadEngine.replay
        gives it: the trace's, else ceil(most pairs routed in a layer / top_k)."""
        top_k = self.engine.geometry.num_experts_per_tok
        from_loads = (-(-routed.max(-1, initial=0) // top_k)).tolist()
        parts = []
        for i, s in enumerate(steps):
            n_tokens = self.trace.n_tokens[s] or from_loads[i]
            size = (n_tokens, self.trace.n_context[s] or n_tokens)
            if size not in self.breakdowns:
                self.breakdowns[size] = self.engine.cost.non_expert_breakdown(*size)
            parts.append(self.breakdowns[size])
        return parts

    def charge(self, steps: range, loads: np.ndarray, plan: ChunkPlan, tables: CodeTables) -> None:
        """What OffloadEngine._apply, begin_step and end_step add for these forwards, each
        float counter summed in the engine's order."""
        engine, c = self.engine, self.engine.counters
        copy_one = engine.cost.copy_time(1)
        f = row_figures(loads, plan, tables)
        parts = self.non_expert(steps, f["routed"])
        split = np.array([(p.before_moe, p.per_moe_layer, p.head) for p in parts], np.float64).reshape(-1, 3)
        n_sync = f["scratch"] + plan.cached_sync
        times = forward_times(split, f["gpu_s"], f["cpu_s"], n_sync, plan.n_async, copy_one, engine.system.overlap)
        c.routed_pairs += int(f["routed"].sum())
        c.missed_pairs += int(f["missed"].sum())
        c.cpu_expert_tokens += int(f["cpu_tokens"].sum())
        c.copies_scratch += int(f["scratch"].sum())
        c.copies_sync += int(plan.cached_sync.sum())
        c.copies_async += int(plan.n_async.sum())
        c.time_non_expert_s = running_sum(c.time_non_expert_s, np.array([p.total for p in parts]))
        c.time_gpu_experts_s = running_sum(c.time_gpu_experts_s, f["gpu_s"])
        c.time_cpu_experts_s = running_sum(c.time_cpu_experts_s, times.cpu_exposed_s)
        c.time_copies_s = running_sum(c.time_copies_s, np.concatenate([times.copies_s, times.drain_s[:, None]], 1))
        c.busy_cpu_experts_s = running_sum(c.busy_cpu_experts_s, f["cpu_s"])
        c.busy_copies_s = running_sum(c.busy_copies_s, (n_sync + plan.n_async) * copy_one)
        self.append_steps(steps, f["routed"].sum(-1).tolist(), f["missed"].sum(-1).tolist(), times.total_s.tolist())

    def append_steps(self, steps: range, routed: list[int], missed: list[int], totals: list[float]) -> None:
        for i, s in enumerate(steps):
            step = self.trace.steps[s]
            self.engine.step_series.append({
                "global_step": step.global_step, "prompt": step.prompt, "kind": step.kind, "block": step.block,
                "step": step.step, "routed_pairs": routed[i], "missed_pairs": missed[i],
                "miss_rate": missed[i] / routed[i] if routed[i] else 0.0, "modeled_latency_s": totals[i],
            })


# ---- checking ------------------------------------------------------------------------
def summary_differences(expected: dict[str, Any], actual: dict[str, Any], rel: float = 1e-9) -> list[str]:
    """Keys where two summaries disagree (a step as 'step_series[i].key'): ints and strings
    exactly, floats to `rel` relative."""
    diffs = [k for k in expected.keys() | actual.keys()
             if k != "step_series" and not _same(expected.get(k), actual.get(k), rel)]
    ours, theirs = expected.get("step_series", []), actual.get("step_series", [])
    if len(ours) != len(theirs):
        diffs.append(f"step_series: {len(ours)} != {len(theirs)} forwards")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        diffs += [f"step_series[{i}].{k}" for k in a.keys() | b.keys() if not _same(a.get(k), b.get(k), rel)]
    return sorted(diffs)


def _same(a: object, b: object, rel: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= rel * max(abs(a), abs(b))
    return type(a) is type(b) and a == b
