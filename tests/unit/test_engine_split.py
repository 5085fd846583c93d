"""The engine's decide/account split: the same bits as plan_layer, one pending layer at
most, and the host seconds it measures (kept out of the summary)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from harness.engine.engine import OffloadEngine, PendingLayer, PlanError
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import System
from harness.placement.trace import RoutingTrace
from systems.registry import make_system
from tests.unit.test_engine import COST, GEOMETRY, LOAD, SYSTEM_OPTIONS, E, engine_for, mask

L = GEOMETRY.n_moe_layers  # 2
LOAD1 = torch.tensor([0, 4, 0, 0, 0, 2, 1, 0])  # layer 1: experts 1, 5 and 6 routed


def _plans() -> list[LayerPlan]:
    """Two forwards x two layers (residency starts {0, 1} in each layer, B = 2): a sync
    fetch with an eviction, a CPU expert and a prefetch into layer 1; a scratch copy; an
    async fetch; a plan that moves nothing."""
    return [
        LayerPlan(gpu=mask(0, 2), cpu=mask(3), fetch_sync=[2], evict=[1], prefetch=[5], prefetch_evict=[1]),
        LayerPlan(gpu=mask(1, 5, 6), cpu=mask(), fetch_sync=[1, 6], scratch=[6], evict=[0]),
        LayerPlan(gpu=mask(2), cpu=mask(0, 3), evict=[0], fetch_async=[4]),
        LayerPlan(gpu=mask(1, 5), cpu=mask(6)),
    ]


class Sequence_(System):
    """Answers the plans it was given, in order."""

    name = "sequence"

    def __init__(self, plans: list[LayerPlan], overlap: bool = False, sleep_s: float = 0.0) -> None:
        super().__init__()
        self.plans, self.overlap, self.sleep_s = list(plans), overlap, sleep_s

    def plan(self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray) -> LayerPlan:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.plans.pop(0)


def _step(s: int) -> StepInfo:
    return StepInfo(prompt=0, block=0, step=s, global_step=s, is_first_block=True)


def _drive(engine: OffloadEngine, split: bool, steps: int = 2) -> list[list[list[int]]]:
    """Run `steps` forwards over LOAD / LOAD1, through plan_layer or decide + account;
    returns the residency right after each layer is decided."""
    seen = []
    for s in range(steps):
        engine.begin_step(_step(s), 3, 3 + s)
        for layer, load in enumerate((LOAD, LOAD1)):
            if split:
                plan, pending = engine.decide(layer, load)
                assert isinstance(pending, PendingLayer) and pending.plan is plan and pending.layer == layer
                seen.append([sorted(r) for r in engine.resident])  # moved before account
                engine.account(pending)
            else:
                engine.plan_layer(layer, load)
                seen.append([sorted(r) for r in engine.resident])
        engine.end_step()
    return seen


@pytest.mark.parametrize("overlap", [False, True])
def test_decide_then_account_equals_plan_layer(overlap: bool) -> None:
    runs = []
    for split in (False, True):
        engine = engine_for(Sequence_(_plans(), overlap=overlap))
        seen = _drive(engine, split)
        runs.append((engine.summary(), seen))
    (whole, seen_whole), (halves, seen_halves) = runs
    assert halves == whole  # every float exactly
    assert seen_halves == seen_whole
    assert seen_whole[0] == [[0, 2], [0, 5]]  # sync fetch of 2 for layer 0, prefetch of 5 into layer 1
    s = whole
    assert (s["copies_sync"], s["copies_scratch"], s["copies_async"]) == (2, 1, 2)
    assert s["cpu_expert_tokens"] == 3 + (1 + 3) + 1


@pytest.mark.parametrize(("name", "options"), [*SYSTEM_OPTIONS, ("dali", {})])
def test_decide_then_account_equals_replay_for_the_systems(name: str, options: dict) -> None:
    gen = torch.Generator().manual_seed(3)
    trace = RoutingTrace(L, E)
    for s in range(6):
        trace.add_step(StepInfo(0, s // 3, s % 3, s, s < 3), 5, 5 + s)
        for layer in range(L):
            trace.record(layer, torch.randint(0, 4, (E,), generator=gen))
    replayed = OffloadEngine(make_system(name, options), GEOMETRY, 2, COST)
    replayed.prepare(trace)
    expected = replayed.replay(trace)
    engine = OffloadEngine(make_system(name, options), GEOMETRY, 2, COST)
    engine.prepare(trace)
    for s, step in enumerate(trace.steps):
        engine.begin_step(step, trace.n_tokens[s], trace.n_context[s])
        for layer in range(L):
            _, pending = engine.decide(layer, trace.loads[s, layer], trace.hint(s, layer))
            engine.account(pending)
        engine.end_step()
    assert engine.summary() == expected
    assert engine.resident == replayed.resident


def test_deciding_twice_without_account_raises() -> None:
    engine = engine_for(Sequence_(_plans()))
    engine.begin_step(_step(0), 3, 3)
    _, pending = engine.decide(0, LOAD)
    with pytest.raises(RuntimeError, match="not accounted"):
        engine.decide(1, LOAD1)
    with pytest.raises(RuntimeError, match="not accounted"):
        engine.plan_layer(1, LOAD1)
    with pytest.raises(RuntimeError, match="not accounted"):
        engine.end_step()
    engine.account(pending)
    with pytest.raises(RuntimeError, match="account"):
        engine.account(pending)  # once only
    _, pending = engine.decide(1, LOAD1)  # the refused calls changed nothing
    engine.account(pending)
    engine.end_step()
    assert engine.summary()["routed_pairs"] == int(LOAD.sum() + LOAD1.sum())


def test_a_rejected_plan_leaves_nothing_pending() -> None:
    bad = LayerPlan(gpu=mask(0, 2), cpu=mask(3))  # 2 neither resident nor fetched
    engine = engine_for(Sequence_([bad, *_plans()]))
    engine.begin_step(_step(0), 3, 3)
    with pytest.raises(PlanError, match="gpu-not-resident"):
        engine.decide(0, LOAD)
    assert [sorted(r) for r in engine.resident] == [[0, 1], [0, 1]]
    _, pending = engine.decide(0, LOAD)
    engine.account(pending)


def test_host_seconds_count_plan_and_bookkeeping_apart() -> None:
    engine = engine_for(Sequence_(_plans(), sleep_s=0.002))
    assert engine.host_seconds() == {"host_plan_s": 0.0, "host_engine_s": 0.0, "host_layer_steps": 0}
    _drive(engine, split=True)
    host = engine.host_seconds()
    assert set(host) == {"host_plan_s", "host_engine_s", "host_layer_steps"}
    assert host["host_layer_steps"] == 2 * L
    assert host["host_plan_s"] >= 2 * L * 0.002  # the plans' sleeps
    assert host["host_engine_s"] > 0.0
    assert not any(key.startswith("host") for key in engine.summary())


def test_host_seconds_of_a_replay() -> None:
    trace = RoutingTrace(L, E)
    for s in range(3):
        trace.add_step(_step(s), 3, 3)
        trace.record(0, LOAD)
        trace.record(1, LOAD1)
    engine = OffloadEngine(make_system("fiddler", {}), GEOMETRY, 2, COST)
    engine.prepare(trace)
    engine.replay(trace)
    host = engine.host_seconds()
    assert host["host_layer_steps"] == 3 * L
    assert host["host_plan_s"] >= 0.0 and host["host_engine_s"] >= 0.0
