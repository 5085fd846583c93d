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
from harness.placement.trace import RoutingTrace
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


def profile(n_layers: int, n_experts: int, hot: list[int]) -> RoutingTrace:
    """A calibration trace (the workload profile) whose top experts in every layer are
    `hot`, the first the most popular."""
    trace = RoutingTrace(n_layers, n_experts)
    trace.add_step(step(0, 0, 0, kind="prefill"))
    load = torch.zeros(n_experts, dtype=torch.long)
    for rank, e in enumerate(hot):
        load[e] = 10 * (len(hot) - rank)
    for layer in range(n_layers):
        trace.record(layer, load)
    return trace


def dali(options: dict, geo=GEO, capacity: int = 2, hot: list[int] | None = None):
    """An engine over dali whose profile makes `hot` (default 0..capacity-1) its residents."""
    return engine("dali", options, geo, capacity, profile(geo.n_moe_layers, geo.num_experts,
                                                           list(range(capacity)) if hot is None else hot))


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
    eng = dali({"prefetch": False})  # resident {0, 1}
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
    eng = dali({"prefetch": False, "replacement": replacement}, capacity=3)
    for g, load in enumerate([loads(12, e0=50, e2=1), loads(12, e1=1, e2=1)]):
        eng.begin_step(step(1, g, g), 50, 50)
        plan = eng.plan_layer(0, load)
        assert not _ids(plan.fetch_sync) and not plan.cpu.any()
        eng.end_step()
    eng.begin_step(step(1, 2, 2), 2000, 2000)
    return eng, eng.plan_layer(0, loads(12, e5=2000))


def test_replacement_evicts_the_lowest_time_correlation_score() -> None:
    eng, plan = _history(replacement=True)
    assert _ids(plan.fetch_sync) == [5] and _ids(plan.evict) == [1] and not _ids(plan.scratch)
    assert eng.layer_resident(0) == {0, 2, 5}


def test_replacement_off_is_lru() -> None:
    eng, plan = _history(replacement=False)
    assert _ids(plan.fetch_sync) == [5] and _ids(plan.evict) == [0]
    assert eng.layer_resident(0) == {1, 2, 5}


def test_without_the_limit_a_copied_expert_that_scores_below_every_resident_goes_to_scratch() -> None:
    eng = dali({"prefetch": False, "gpu_limit": False}, capacity=1)  # resident {0}
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
    eng = dali({"prefetch_k": 2}, geometry(2, 8))  # both layers hold {0, 1}
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
    eng = dali({"prefetch_k": 4}, geometry(2, 8))
    eng.begin_step(step(1, 0, 0), 4, 4)
    hint = torch.tensor([5.0, 0.1, 0, 0, 0, 0, 3.0, 2.0])
    plan = eng.plan_layer(0, loads(8, e0=1), hint)  # a 13 us layer: no time to copy anything
    assert not plan.prefetch and eng.layer_resident(1) == {0, 1}


def test_prefetch_off_asks_for_no_hint_and_moves_nothing_ahead() -> None:
    assert dali({"prefetch": False}, geometry(2, 8)).system.wants_hint  # the assignment predicts from it
    eng = dali({"prefetch": False, "assign_loads": "exact"}, geometry(2, 8))
    assert not eng.system.wants_hint
    eng.begin_step(step(1, 0, 0), 4, 4)
    plan = eng.plan_layer(0, loads(8, e0=1), torch.tensor([0, 0, 0, 0, 0, 0, 9.0, 0]))
    assert not plan.prefetch and eng.layer_resident(1) == {0, 1}


def test_assign_off_puts_residents_on_the_gpu_and_the_rest_on_the_cpu() -> None:
    eng = dali({"assign": False, "prefetch": False})
    eng.begin_step(step(1, 0, 0), 3000, 3000)
    plan = eng.plan_layer(0, loads(12, e0=3, e5=3000))  # the greedy would copy 5
    assert np.flatnonzero(plan.gpu).tolist() == [0] and np.flatnonzero(plan.cpu).tolist() == [5]
    assert not _ids(plan.fetch_sync) and not _ids(plan.evict)


@pytest.mark.parametrize(
    ("options", "key"),
    [({"assign": "yes"}, "system.assign"), ({"prefetch_k": 0}, "system.prefetch_k"), ({"horizon": 0}, "system.horizon"),
     ({"assign_loads": "oracle"}, "system.assign_loads"), ({"gpu_limit": 1}, "system.gpu_limit")],
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
    {"prefetch_k": 2, "horizon": 1},
    {"assign_loads": "exact"},
    {"gpu_limit": False},
]


# ---- the memory limit, the initial residency, predicted loads -------------------------
def test_the_initial_residents_are_the_profile_top_b_not_the_first_ids() -> None:
    eng = dali({}, capacity=3, hot=[7, 2, 9, 4])
    assert eng.layer_resident(0) == {7, 2, 9}


def test_dali_without_a_profile_is_refused() -> None:
    with pytest.raises(HarnessError, match="calibration"):
        engine("dali", {}, GEO, 2)


def test_under_the_limit_a_layer_never_computes_more_than_b_experts_on_the_gpu() -> None:
    """Heavy loads everywhere would put every expert on the GPU without the limit; with it
    no plan has more than B GPU experts, nothing goes to scratch and residency stays B."""
    rng = np.random.default_rng(0)
    for capacity in (1, 2, 3):
        eng = dali({"prefetch": False}, capacity=capacity)
        free = dali({"prefetch": False, "gpu_limit": False}, capacity=capacity)
        over = 0
        for g in range(40):
            load = torch.from_numpy(rng.integers(0, 3000, 12) * (rng.random(12) < 0.7))
            for e, limited in ((eng, True), (free, False)):
                e.begin_step(step(1, g, g), 3000, 3000)
                plan = e.plan_layer(0, load)
                if limited:
                    assert plan.gpu.sum() <= capacity and not _ids(plan.scratch)
                    assert len(e.layer_resident(0)) <= capacity
                else:
                    over += plan.gpu.sum() > capacity
                e.end_step()
        assert over > 0  # the case is one where the limit binds
        assert eng.summary()["copies_scratch"] == 0


def test_under_the_limit_the_scratch_case_computes_the_newcomer_on_the_cpu() -> None:
    eng = dali({"prefetch": False}, capacity=1)  # resident {0}
    eng.begin_step(step(1, 0, 0), 3000, 3000)
    plan = eng.plan_layer(0, loads(12, e0=1000, e3=900))
    assert np.flatnonzero(plan.gpu).tolist() == [0] and np.flatnonzero(plan.cpu).tolist() == [3]
    assert not _ids(plan.scratch) and eng.layer_resident(0) == {0}


def test_predicted_loads_decide_the_assignment_and_exact_loads_are_an_option() -> None:
    """Layer 1's hint (handed at layer 0) predicts expert 5 heavy; the true load puts 2000
    tokens on expert 4 instead. From the prediction dali copies nothing for 4 (it was not
    named: the CPU computes it); from the exact loads it copies 4."""
    geo = geometry(2, 12)
    hint = torch.zeros(12)
    hint[5], hint[0] = 0.9, 0.1
    for assign_loads, gpu in (("predicted", [0]), ("exact", [4])):
        eng = dali({"prefetch": False, "assign_loads": assign_loads}, geo)
        eng.begin_step(step(1, 0, 0), 2000, 2000)
        eng.plan_layer(0, loads(12, e0=1), hint)
        plan = eng.plan_layer(1, loads(12, e0=1, e4=2000))
        assert np.flatnonzero(plan.gpu).tolist() == gpu, assign_loads
        assert eng.system.report()["assign_loads"] == assign_loads


def test_scale_to_pairs_keeps_the_total_and_rounds_by_largest_remainder() -> None:
    from systems.dali_assign import scale_to_pairs

    assert scale_to_pairs(np.array([5.0, 0.1, 0, 0, 0, 0, 3.0, 2.0]), 4).tolist() == [2, 0, 0, 0, 0, 0, 1, 1]
    assert scale_to_pairs(np.zeros(3), 5).tolist() == [0, 0, 0]
    assert scale_to_pairs(np.array([1.0, 1.0, 1.0]), 4).tolist() == [2, 1, 1]
