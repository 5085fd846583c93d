"""budget.scope: per_layer (B per layer) or global (B x layers in total, any split)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.accounting.budget import BudgetConfig, resolve_budget
from harness.accounting.cost import CostModel, HardwareConfig
from harness.common.errors import HarnessError
from harness.engine.engine import OffloadEngine, PlanError
from harness.model.config import LLaDA2Config
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import System
from harness.placement.trace import RoutingTrace
from systems.registry import make_system

GEO = LLaDA2Config(num_hidden_layers=3, num_experts=8, n_group=1, topk_group=1, num_experts_per_tok=2)
COST = CostModel(GEO, HardwareConfig())
B = 2  # per layer; 2 MoE layers -> 4 in total under a global budget


def calibration(popularity: list[list[int]]) -> RoutingTrace:
    trace = RoutingTrace(len(popularity), 8)
    trace.add_step(StepInfo(0, 0, 0, 0, True))
    for layer, row in enumerate(popularity):
        trace.record(layer, torch.tensor(row))
    return trace


POPULAR = [[9, 8, 7, 6, 0, 0, 0, 0],  # layer 0 is the busy one
           [0, 0, 0, 0, 0, 1, 0, 0]]


def test_fiddler_ranks_per_layer_by_default_and_over_the_model_under_global() -> None:
    per_layer = OffloadEngine(make_system("fiddler"), GEO, B, COST)
    per_layer.prepare(calibration(POPULAR))
    assert per_layer.resident == [{0, 1}, {0, 5}]  # layer 1: 5, then the lowest unrouted id
    global_ = OffloadEngine(make_system("fiddler"), GEO, B, COST, budget_scope="global")
    global_.prepare(calibration(POPULAR))
    assert global_.resident == [{0, 1, 2, 3}, set()]  # the 4 most popular pairs are all in layer 0
    assert global_.summary()["total_capacity"] == 4


class Hoarder(System):
    """Fetches every routed expert into its layer and evicts nothing: over any budget."""

    name = "hoarder"

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        return [set() for _ in range(n_layers)]

    def plan(self, layer, load, hint, resident) -> LayerPlan:
        routed = load > 0
        return LayerPlan(gpu=routed, cpu=np.zeros_like(routed),
                         fetch_sync=np.flatnonzero(routed & ~resident))


def run_hoarder(scope: str, loads: list[list[int]]) -> OffloadEngine:
    engine = OffloadEngine(Hoarder(), GEO, B, COST, budget_scope=scope)
    engine.prepare(None)
    engine.begin_step(StepInfo(0, 0, 0, 0, True), 4, 4)
    for layer, row in enumerate(loads):
        engine.plan_layer(layer, torch.tensor(row))
    engine.end_step()
    return engine


def test_the_engine_checks_the_total_under_a_global_budget() -> None:
    three_then_one = [[1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]]
    with pytest.raises(PlanError, match="'capacity'"):  # per layer: 3 > B in layer 0
        run_hoarder("per_layer", three_then_one)
    engine = run_hoarder("global", three_then_one)  # 3 + 1 = 4 = B x layers: any split is fine
    assert [len(r) for r in engine.resident] == [3, 1]
    with pytest.raises(PlanError, match="global-capacity"):  # 3 + 2 > 4
        run_hoarder("global", [[1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 1]])


def test_the_scope_is_checked_and_recorded() -> None:
    with pytest.raises(HarnessError, match=r"budget\.scope"):
        BudgetConfig(scope="per_gpu")
    assert "scope" not in resolve_budget(BudgetConfig(gpu_gb=40.0), GEO).as_dict()  # per_layer, as before
    assert resolve_budget(BudgetConfig(gpu_gb=40.0, scope="global"), GEO).as_dict()["scope"] == "global"


def run_dali(scope: str, forwards: int = 4, **options) -> OffloadEngine:
    """Layer 0 routes experts 4..7 with many tokens each, layer 1 one token to expert 0."""
    engine = OffloadEngine(make_system("dali", {"prefetch": False, **options}), GEO, B, COST, budget_scope=scope)
    profile = RoutingTrace(2, 8)  # dali's workload profile: experts 0 and 1 first in both layers
    profile.add_step(StepInfo(0, 0, 0, 0, True))
    for layer in range(2):
        profile.record(layer, torch.tensor([2, 1, 0, 0, 0, 0, 0, 0]))
    engine.prepare(profile)
    for step in range(forwards):
        engine.begin_step(StepInfo(0, 0, step, step, True), 64, 64)
        engine.plan_layer(0, torch.tensor([0, 0, 0, 0, 64, 64, 64, 64]))
        engine.plan_layer(1, torch.tensor([1, 0, 0, 0, 0, 0, 0, 0]))
        engine.end_step()
    return engine


def test_dali_ranks_over_the_model_under_a_global_budget() -> None:
    per_layer = run_dali("per_layer")
    assert [len(r) for r in per_layer.resident] == [2, 2]
    global_ = run_dali("global")
    resident = global_.resident
    # the busy layer takes the idle layer's slots (its unused experts score lowest), within B x layers
    assert len(resident[0]) > B and sum(len(r) for r in resident) <= 2 * B
    assert resident == [resident[0] & {4, 5, 6, 7}, {0}]  # layer 1 keeps only the expert it uses
    assert global_.summary()["missed_pairs"] < per_layer.summary()["missed_pairs"]


class ElsewhereEvictor(System):
    """Layer 1 evicts the given (layer, expert) pairs; computes everything on the CPU."""

    name = "elsewhere"

    def __init__(self, pairs: list[tuple[int, int]]) -> None:
        super().__init__()
        self.pairs = pairs

    def plan(self, layer, load, hint, resident) -> LayerPlan:
        routed = load > 0
        return LayerPlan(gpu=np.zeros_like(routed), cpu=routed, evict_elsewhere=self.pairs if layer == 1 else [])


@pytest.mark.parametrize(("pairs", "rule"), [([(0, 1)], None), ([(1, 0)], "evict-elsewhere-layer"),
                                             ([(0, 5)], "evict-elsewhere-not-resident"),
                                             ([(0, 1), (0, 1)], "duplicate")])
def test_evictions_in_other_layers_are_checked_and_applied(pairs, rule) -> None:
    engine = OffloadEngine(ElsewhereEvictor(pairs), GEO, B, COST)
    engine.prepare(None)
    engine.begin_step(StepInfo(0, 0, 0, 0, True), 1, 1)
    engine.plan_layer(0, torch.tensor([1, 0, 0, 0, 0, 0, 0, 0]))
    if rule is None:
        engine.plan_layer(1, torch.tensor([1, 0, 0, 0, 0, 0, 0, 0]))
        assert engine.resident == [{0}, {0, 1}]
    else:
        with pytest.raises(PlanError, match=rule):
            engine.plan_layer(1, torch.tensor([1, 0, 0, 0, 0, 0, 0, 0]))
