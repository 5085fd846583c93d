"""Replay in batch: a system that plans whole chunks of forwards at once (a vectorized
planner beside its `plan`, in its own file in systems/, named by its registry entry) is
replayed chunk by chunk, and the engine's ledger charges each chunk; every other system
is replayed by the engine, layer by layer. Either way the engine ends as the replay leaves it (ledger, residency),
so `engine.summary()` and the system's `report()` read the same, to the bit
(tests/integration/test_batch_replay.py holds each planner to its `plan`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from harness.accounting.bitsets import as_sets
from harness.accounting.ledger import LayerOutcomes
from harness.engine.engine import OffloadEngine
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from systems.registry import REGISTRY, entry_of

CHUNK_ELEMENTS = 1 << 20  # (forward, layer, expert) entries per chunk: bounds memory, keeps ops large


class ReplayOutcome(NamedTuple):
    summary: dict[str, Any]
    mode: str  # "fast": the system's batch planner | "engine": layer by layer


def replay_trace(engine: OffloadEngine, trace: RoutingTrace, allow_batch: bool = True) -> ReplayOutcome:
    """Replay `trace` through `engine`: in batch when the system plans in batch, else
    the engine's layer-by-layer replay."""
    if allow_batch and batch_refusal(engine, trace) is None:
        return ReplayOutcome(batch_replay(engine, trace), "fast")
    return ReplayOutcome(engine.replay(trace), "engine")


def batch_refusal(engine: OffloadEngine, trace: RoutingTrace) -> str | None:
    """Why a batch replay cannot stand in for `engine.replay(trace)`; None when it can."""
    if engine.topology.multi:
        return "topology=multi"
    if engine.trace is not None:
        return "the engine is recording a trace"
    if not engine._prepared or engine.in_forward:  # let the engine raise its own error
        return "the engine is not prepared, or has a forward open"
    if (trace.n_layers, trace.n_experts) != (engine.n_layers, engine.n_experts):
        return "the trace's geometry differs from the engine's"
    if engine.system.name not in REGISTRY or not REGISTRY[engine.system.name].plans_in_batch(engine.system):
        return f"system {engine.system.name!r} does not plan in batch"
    return None


def batch_replay(engine: OffloadEngine, trace: RoutingTrace) -> dict[str, Any]:
    """`engine.replay(trace)` for an engine whose system plans in batch."""
    engine.ledger.flush()
    for steps, sizes, outcomes in planned_chunks(engine, trace):
        engine.ledger.charge(steps, sizes, outcomes)
    return engine.summary()


def planned_chunks(engine: OffloadEngine, trace: RoutingTrace, loads: np.ndarray | None = None
                   ) -> Iterator[tuple[list[StepInfo], list[tuple[int, int]], LayerOutcomes]]:
    """What the system decides for `trace`, chunk after chunk of forwards, in order: (steps,
    (tokens, context) per forward, outcomes), without charging anything (`batch_replay`
    charges each chunk; the sensitivity analysis keeps them to charge under other profiles).
    `loads`: the trace's loads as int64 [S, L, E] when the caller has them; the engine's
    residency ends as the replay leaves it."""
    refusal = batch_refusal(engine, trace)
    if refusal is not None:
        raise ValueError(f"no batch replay: {refusal}")
    planner = entry_of(engine.system).planner(engine.system, engine.resident, engine.n_experts)
    if loads is None:
        loads = trace.loads.numpy().astype(np.int64)
    if loads.size and int(loads.min()) < 0:
        raise ValueError("the trace holds negative expert loads")
    top_k = engine.geometry.num_experts_per_tok
    chunk = max(1, CHUNK_ELEMENTS // max(1, engine.n_layers * engine.n_experts))
    for first in range(0, len(trace), chunk):
        last = min(first + chunk, len(trace))
        steps = trace.steps[first:last]
        outcomes = planner.plan(loads[first:last], steps)
        yield steps, [trace.forward_size(s, top_k) for s in range(first, last)], outcomes
    engine.resident = as_sets(planner.residency())


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
