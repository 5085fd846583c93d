"""One property test over every registered system: on random load sequences, through the
engine, every option set its entry names keeps the plan rules (each routed expert computed
exactly once, capacity never exceeded, counters that the plans add up to), and the oracle's
modeled time bounds every budget-B system from below. A new system gets this by
registering (docs/adding-a-system.md); the toy system below shows it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.engine.plan_rules import PlanError
from harness.placement.plan import LayerPlan
from harness.placement.system import System
from systems.entry import SystemEntry
from systems.registry import ENTRIES, REGISTRY, build_registry
from tests.system_drive import drive, geometry, random_trace

SINGLE_GPU = [name for name, entry in REGISTRY.items() if not entry.multi_gpu]  # multi-GPU: tests/unit/test_gem.py


def check_entry(entry: SystemEntry, seed: int, n_layers: int, n_experts: int, capacity: int, heavy: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    geo = geometry(n_layers, n_experts)
    calibration = random_trace(gen, n_layers, n_experts, heavy)
    work = random_trace(gen, n_layers, n_experts, heavy)
    bound = drive("oracle", {}, geo, capacity, calibration, work)["modeled_time_s"]
    for options in entry.invariant_options:
        system = entry.policy(entry.config(**options))
        modeled = drive(system, {}, geo, capacity, calibration, work)["modeled_time_s"]
        if not entry.policy.ignores_budget:  # gpu_only holds all E experts: not a budget-B system
            assert bound <= modeled * (1 + 1e-9), (entry.name, options)


CASES = dict(
    seed=st.integers(0, 2**31),
    n_layers=st.integers(1, 3),
    n_experts=st.sampled_from([8, 16]),
    capacity=st.integers(0, 8),
    heavy=st.booleans(),
)


@pytest.mark.parametrize("name", SINGLE_GPU)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CASES)
def test_every_registered_system_keeps_the_rules_and_the_oracle_bounds_it(
    name: str, seed: int, n_layers: int, n_experts: int, capacity: int, heavy: bool
) -> None:
    check_entry(REGISTRY[name], seed, n_layers, n_experts, capacity, heavy)


# ---- a new system gets the test by registering ------------------------------------------
@dataclass
class AllOnCpuConfig:
    name: str = "all_on_cpu"


class AllOnCpu(System):
    """A toy policy: resident experts on the GPU, every other routed one on the CPU."""

    name = "all_on_cpu"
    config_class = AllOnCpuConfig

    def plan(self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray) -> LayerPlan:
        routed = load > 0
        return LayerPlan(gpu=routed & resident, cpu=routed & ~resident)


class GpuBeyondCapacity(AllOnCpu):
    """A broken toy: computes every routed expert on the GPU without copying it."""

    def plan(self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray) -> LayerPlan:
        return LayerPlan(gpu=load > 0, cpu=np.zeros_like(load, bool))


def test_a_registered_toy_system_gets_the_invariant_test() -> None:
    registry = build_registry((*ENTRIES, SystemEntry(AllOnCpu, AllOnCpuConfig)))
    for seed in range(5):
        check_entry(registry["all_on_cpu"], seed, n_layers=2, n_experts=8, capacity=3, heavy=seed % 2 == 0)


def test_the_invariant_test_catches_a_plan_that_breaks_the_rules() -> None:
    broken = SystemEntry(GpuBeyondCapacity, AllOnCpuConfig)
    with pytest.raises(PlanError):
        check_entry(broken, 1, n_layers=2, n_experts=8, capacity=3, heavy=False)


def test_two_entries_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="two systems"):
        build_registry((*ENTRIES, ENTRIES[0]))
