"""dali: the greedy assignment against the brute-force optimum, replacement and prefetch on
hand-made loads, the ablation switches, property tests through the engine, and a lossless
run on the tiny proxy."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.accounting.cost import CostModel, HardwareConfig, expert_shape
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from systems.dali_assign import finish_time, greedy_assignment, greedy_pass, side_costs
from systems.registry import make_system
from tests.system_drive import engine, geometry, loads, step

register_configs()

GEO = geometry(1, 12)
HARDWARE = {
    "a100": HardwareConfig(),
    "table": HardwareConfig(
        cpu_table_shape=expert_shape(GEO), cpu_table_tokens=[1, 4, 16, 64], cpu_table_seconds=[2e-4, 2.5e-4, 6e-4, 2e-3]
    ),
    "slow_pcie": HardwareConfig(pcie_gbps=5.0),
    "slow_cpu": HardwareConfig(cpu_tflops=0.2, cpu_mem_gbps=50.0),
    "fast_pcie_slow_gpu": HardwareConfig(pcie_gbps=64.0, gpu_bf16_tflops=50.0),
}
# Proved: the heaviest-first pass raises the finish time by at most min(gpu side, cpu) per
# expert and the optimum is at least half the sum of those minima; the refinement only
# lowers it. Measured: the worst ratio over 100,000 random cases (random_case with seeds
# 0..19999 on each of the five profiles) was 1.494; the mean is within 1% of optimal.
PROVED_BOUND = 2.0
MEASURED_BOUND = 1.5


def _ids(field: object) -> list[int]:
    """A plan's id field as a list: dali fills bool masks [E] (a compiled kernel writes them)."""
    if isinstance(field, np.ndarray) and field.dtype == np.bool_:
        return np.flatnonzero(field).tolist()
    return list(field)


def brute_force_optimum(load: torch.Tensor, held: torch.Tensor, cost: CostModel) -> float:
    """min over every GPU/CPU split of the routed experts of the layer's finish time."""
    gpu, cpu = (torch.from_numpy(t) for t in side_costs(load, held, cost))
    ids = torch.nonzero(load > 0).flatten()
    n = len(ids)
    masks = ((torch.arange(2**n)[:, None] >> torch.arange(n)) & 1).bool()  # every subset on the GPU
    gpu_side = (masks.double() * gpu[ids]).sum(1)
    cpu_side = ((~masks).double() * cpu[ids]).sum(1)
    return float(torch.maximum(gpu_side, cpu_side).min())


def random_case(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 10, (1,), generator=gen))
    load = torch.zeros(12, dtype=torch.long)
    ids = torch.randperm(12, generator=gen)[:n]
    load[ids] = torch.randint(1, (8, 60, 900, 3000)[seed % 4], (n,), generator=gen)
    held = torch.rand(12, generator=gen) < float(torch.rand(1, generator=gen))
    return load, held


def ratio(load: torch.Tensor, held: torch.Tensor, cost: CostModel) -> float:
    on_gpu = greedy_assignment(load, held, cost)
    assert not (on_gpu & (load == 0).numpy()).any()  # never places an unrouted expert
    return finish_time(on_gpu, load, held, cost) / brute_force_optimum(load, held, cost)


# ---- the greedy against the optimum -------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31), hw=st.sampled_from(list(HARDWARE)))
def test_greedy_is_within_its_proved_bound_of_the_brute_force_optimum(seed: int, hw: str) -> None:
    r = ratio(*random_case(seed), CostModel(GEO, HARDWARE[hw]))
    assert 1 - 1e-9 <= r <= PROVED_BOUND


@pytest.mark.parametrize("hw", list(HARDWARE))
def test_greedy_worst_ratio_over_fixed_random_cases_is_the_measured_bound(hw: str) -> None:
    cost = CostModel(GEO, HARDWARE[hw])
    ratios = [ratio(*random_case(seed), cost) for seed in range(300)]
    assert max(ratios) <= MEASURED_BOUND
    assert sum(ratios) / len(ratios) <= 1.01
    assert sum(r < 1 + 1e-9 for r in ratios) >= 0.9 * len(ratios)  # optimal in most cases (measured ~96%)


def test_refinement_repairs_a_case_where_heaviest_first_is_almost_twice_the_optimum() -> None:
    # four resident 7/6-token experts and a missing 4-token one: by tokens the greedy
    # fills the GPU, pushes a resident expert to the CPU, then the missing one joins it
    cost = CostModel(GEO, HardwareConfig())
    load = loads(12, e2=7, e4=7, e7=6, e10=6, e8=4)
    held = torch.zeros(12, dtype=torch.bool)
    held[[0, 1, 2, 4, 7, 10]] = True
    gpu, cpu = side_costs(load, held, cost)
    first = greedy_pass(load, gpu, cpu)
    optimum = brute_force_optimum(load, held, cost)
    assert finish_time(first, load, held, cost) > 1.9 * optimum
    final = greedy_assignment(load, held, cost)
    assert finish_time(final, load, held, cost) == pytest.approx(optimum)
    assert np.flatnonzero(final).tolist() == [2, 4, 7, 10]  # the residents; 8 on the CPU


def test_a_heavy_missing_expert_is_copied_and_the_idle_cpu_takes_the_light_ones() -> None:
    eng = engine("dali", {"prefetch": False}, GEO, 2)  # resident {0, 1}
    eng.begin_step(step(1, 0, 0), 2000, 2000)
    load = loads(12, e0=3, e5=2000, e6=2, e7=1)
    plan = eng.plan_layer(0, load)
    # 5 costs ~8 ms on the CPU but ~0.3 ms copied; while its copy and compute run, the CPU
    # finishes the three light experts, even the resident 0
    assert np.flatnonzero(plan.gpu).tolist() == [5]
    assert np.flatnonzero(plan.cpu).tolist() == [0, 6, 7]
    assert _ids(plan.fetch_sync) == [5] and _ids(plan.evict) == [1]  # 1 is idle and scores lowest
    assert eng.layer_resident(0) == {0, 5}
    held = torch.zeros(12, dtype=torch.bool)
    held[[0, 1]] = True
    cost = CostModel(GEO, HardwareConfig())
    assert finish_time(plan.gpu, load, held, cost) == pytest.approx(brute_force_optimum(load, held, cost))


# ---- replacement ----------------------------------------------------------------------
def _history(replacement: bool):
    """Capacity 3 holding {0, 1, 2}; after two steps expert 0 is the least recent but the
    busiest, expert 1 the least busy; then a heavy miss needs a slot."""
    eng = engine("dali", {"prefetch": False, "replacement": replacement}, GEO, 3)
    for g, load in enumerate([loads(12, e0=50, e2=1), loads(12, e1=1, e2=1)]):
        eng.begin_step(step(1, g, g), 50, 50)
        plan = eng.plan_layer(0, load)
        assert not _ids(plan.fetch_sync) and not plan.cpu.any()
        eng.end_step()
    eng.begin_step(step(1, 2, 2), 2000, 2000)
    return eng, eng.plan_layer(0, loads(12, e5=2000))


def test_replacement_evicts_the_lowest_decayed_workload_score() -> None:
    eng, plan = _history(replacement=True)
    assert _ids(plan.fetch_sync) == [5] and _ids(plan.evict) == [1] and not _ids(plan.scratch)
    assert eng.layer_resident(0) == {0, 2, 5}


def test_replacement_off_is_lru() -> None:
    eng, plan = _history(replacement=False)
    assert _ids(plan.fetch_sync) == [5] and _ids(plan.evict) == [0]
    assert eng.layer_resident(0) == {1, 2, 5}


def test_a_copied_expert_that_scores_below_every_resident_goes_to_scratch() -> None:
    eng = engine("dali", {"prefetch": False}, GEO, 1)  # resident {0}
    for g in range(3):
        eng.begin_step(step(1, g, g), 3000, 3000)
        plan = eng.plan_layer(0, loads(12, e0=3000))
        eng.end_step()
    eng.begin_step(step(1, 3, 3), 3000, 3000)
    plan = eng.plan_layer(0, loads(12, e0=1000, e3=900))
    assert plan.gpu[3] and _ids(plan.scratch) == [3] and not _ids(plan.evict)  # 3's score < 0's: not cached
    assert eng.layer_resident(0) == {0}


# ---- prefetch and the ablation switches ---------------------------------------------
def test_prefetch_copies_the_predicted_heaviest_and_keeps_the_predicted_top_b() -> None:
    eng = engine("dali", {"prefetch_k": 2}, geometry(2, 8), 2)  # both layers hold {0, 1}
    eng.begin_step(step(1, 0, 0), 4, 4)
    hint = torch.tensor([5.0, 0.1, 0, 0, 0, 0, 3.0, 2.0])  # layer 1's predicted top-2: 0 and 6
    # five 8-token misses keep the CPU busy for ~1.02 copy times (copying one would not
    # shorten the layer): room for one prefetch, though prefetch_k allows two
    plan = eng.plan_layer(0, loads(8, e0=1, e2=8, e3=8, e4=8, e5=8, e7=8), hint)
    assert plan.cpu.sum() == 5 and not _ids(plan.fetch_sync)
    assert plan.prefetch == [6] and plan.prefetch_evict == [1]
    assert eng.layer_resident(1) == {0, 6}
    assert not _ids(eng.plan_layer(1, loads(8, e6=3, e0=1)).fetch_sync)
    eng.end_step()
    assert eng.summary()["copies_async"] == 1 and eng.summary()["missed_pairs"] == 40  # layer 0's only


def test_prefetch_waits_for_an_idle_link() -> None:
    eng = engine("dali", {"prefetch_k": 4}, geometry(2, 8), 2)
    eng.begin_step(step(1, 0, 0), 4, 4)
    hint = torch.tensor([5.0, 0.1, 0, 0, 0, 0, 3.0, 2.0])
    plan = eng.plan_layer(0, loads(8, e0=1), hint)  # a 13 us layer: no time to copy anything
    assert not plan.prefetch and eng.layer_resident(1) == {0, 1}


def test_prefetch_off_asks_for_no_hint_and_moves_nothing_ahead() -> None:
    eng = engine("dali", {"prefetch": False}, geometry(2, 8), 2)
    assert not eng.system.wants_hint
    eng.begin_step(step(1, 0, 0), 4, 4)
    plan = eng.plan_layer(0, loads(8, e0=1), torch.tensor([0, 0, 0, 0, 0, 0, 9.0, 0]))
    assert not plan.prefetch and eng.layer_resident(1) == {0, 1}


def test_assign_off_puts_residents_on_the_gpu_and_the_rest_on_the_cpu() -> None:
    eng = engine("dali", {"assign": False, "prefetch": False}, GEO, 2)
    eng.begin_step(step(1, 0, 0), 3000, 3000)
    plan = eng.plan_layer(0, loads(12, e0=3, e5=3000))  # the greedy would copy 5
    assert np.flatnonzero(plan.gpu).tolist() == [0] and np.flatnonzero(plan.cpu).tolist() == [5]
    assert not _ids(plan.fetch_sync) and not _ids(plan.evict)


@pytest.mark.parametrize(
    ("options", "key"),
    [({"assign": "yes"}, "system.assign"), ({"prefetch_k": 0}, "system.prefetch_k"), ({"decay": 1.0}, "system.decay")],
)
def test_dali_rejects_invalid_options(options: dict, key: str) -> None:
    with pytest.raises(HarnessError, match=re.escape(key)):
        make_system("dali", options)


# ---- every variant through the engine -------------------------------------------------
VARIANTS = [
    {},
    {"assign": False},
    {"prefetch": False},
    {"replacement": False},
    {"prefetch_k": 2, "decay": 0.0},
]
