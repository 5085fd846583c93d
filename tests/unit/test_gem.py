"""Multi-GPU topology, ep_linear and gem: speed profiles, the expert-parallel charge, the
pairing errors, gem's search against ep_linear on its own calibration window, a slow GPU,
property tests through the engine, and lossless runs on the tiny proxy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.accounting.cost import CostModel, HardwareConfig
from harness.accounting.topology import (
    VARIABILITY_SPREAD,
    Topology,
    TopologyConfig,
    build_topology,
    check_system_topology,
    gpu_speeds,
)
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.engine.engine import OffloadEngine, PlanError
from harness.job.config import register_configs
from harness.model.config import LLaDA2Config
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import System
from harness.placement.trace import RoutingTrace
from systems.ep_linear import linear_mapping
from systems.gem import improve_by_swaps
from systems.registry import make_system
from tests.system_drive import random_steps

register_configs()


def geometry(n_layers: int, n_experts: int, top_k: int = 4) -> LLaDA2Config:
    return LLaDA2Config(
        num_hidden_layers=n_layers + 1, num_experts=n_experts, n_group=1, topk_group=1, num_experts_per_tok=top_k
    )


def multi(*speeds: float) -> Topology:
    return Topology("multi", tuple(speeds))


def ep_engine(name: str, options: dict, geo: LLaDA2Config, topology: Topology, calibration=None) -> OffloadEngine:
    """gem searches its calibration window here unless the options ask for the online one."""
    if name == "gem":
        options = {"window": "calibration", **options}
    eng = OffloadEngine(make_system(name, options), geo, 0, CostModel(geo, HardwareConfig()), topology=topology)
    eng.prepare(calibration)
    return eng


def denoise_trace(loads: torch.Tensor) -> RoutingTrace:
    """A trace of denoise forwards with the given loads [S, L, E]."""
    n_steps, n_layers, n_experts = loads.shape
    trace = RoutingTrace(n_layers, n_experts)
    for s in range(n_steps):
        trace.add_step(StepInfo(0, s // 4, s % 4, s, False), 8, 8)
        for layer in range(n_layers):
            trace.record(layer, loads[s, layer])
    return trace


def random_loads(gen: torch.Generator, n_steps: int, n_layers: int, n_experts: int, skew: float) -> torch.Tensor:
    """Zipf-like popularity (a random permutation per layer), tokens from 1 to ~300."""
    out = torch.zeros(n_steps, n_layers, n_experts, dtype=torch.long)
    for layer in range(n_layers):
        p = (1.0 / torch.arange(1, n_experts + 1).double() ** skew)[torch.randperm(n_experts, generator=gen)]
        for s in range(n_steps):
            routed = torch.rand(n_experts, generator=gen, dtype=torch.float64) < p / p.max()
            out[s, layer] = routed * torch.randint(1, 300, (n_experts,), generator=gen)
    return out


def score(cost: CostModel, speeds: tuple[float, ...], loads: torch.Tensor, mapping: torch.Tensor) -> float:
    """The slowest GPU's time summed over steps, written out (not gem's own code): each GPU
    sums the cost model's grouped-GEMM time of the experts it owns, divided by its speed."""
    total = 0.0
    for load in loads:
        busy = [0.0] * len(speeds)
        for e, n in enumerate(load.tolist()):
            one = float(cost.grouped_gpu_expert_times(torch.tensor([n]))[0])
            busy[int(mapping[e])] += one / speeds[int(mapping[e])]
        total += max(busy)
    return total


# ---- topology -------------------------------------------------------------------------
def test_speed_profiles_have_the_spread_of_their_level_and_follow_the_seed() -> None:
    for level, spread in VARIABILITY_SPREAD.items():
        speeds = gpu_speeds(4, level, seed=3)
        assert max(speeds) == 1.0 and min(speeds) == pytest.approx(1 - spread)
        assert speeds == gpu_speeds(4, level, seed=3)
    assert gpu_speeds(8, "high", 0) != gpu_speeds(8, "high", 1)
    assert build_topology(None).n_gpus == 1 and not build_topology(TopologyConfig()).multi
    explicit = build_topology(TopologyConfig(name="multi", n_gpus=2, speeds=[1.0, 0.5]))
    assert explicit.speeds == (1.0, 0.5)


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"name": "single", "n_gpus": 4}, "topology=multi topology.n_gpus=4"),
        ({"name": "multi", "n_gpus": 1}, "topology.n_gpus=1"),
        ({"name": "multi", "n_gpus": 4, "variability": "wild"}, "topology.variability"),
        ({"name": "multi", "n_gpus": 2, "speeds": [1.0]}, "topology.speeds"),
        ({"name": "ring"}, "topology.name"),
    ],
)
def test_bad_topologies_are_one_line_errors(values: dict, match: str) -> None:
    with pytest.raises(HarnessError, match=match) as err:  # checked when the config is built
        TopologyConfig(**values)
    assert "\n" not in str(err.value)


def test_systems_and_topologies_must_pair() -> None:
    with pytest.raises(HarnessError, match="add topology=multi"):
        check_system_topology("gem", True, build_topology(None))
    with pytest.raises(HarnessError, match="use topology=single"):
        check_system_topology("tide", False, multi(1.0, 1.0))
    with pytest.raises(HarnessError, match="topology=multi"):  # the engine checks too (replay)
        ep_engine("ep_linear", {}, geometry(1, 8), build_topology(None))
    with pytest.raises(HarnessError, match=r"system=ep_linear maps experts over several GPUs"):
        compose_checked(["model=tiny", "system=ep_linear"])
    with pytest.raises(HarnessError, match=r"system=dali runs on one GPU"):
        compose_checked(["model=tiny", "system=dali", "topology=multi"])


def test_the_engine_charges_an_expert_parallel_layer_as_its_slowest_gpu() -> None:
    geo = geometry(1, 8)
    cost = CostModel(geo, HardwareConfig())
    load = torch.tensor([400, 0, 10, 0, 900, 1, 0, 0])
    eng = ep_engine("ep_linear", {}, geo, multi(1.0, 0.5))  # GPU 0: experts 0-3, GPU 1: 4-7
    eng.begin_step(StepInfo(0, 1, 0, 0, False), 8, 8)
    plan = eng.plan_layer(0, load)
    eng.end_step()
    one = cost.grouped_gpu_expert_times  # a GPU's experts as one grouped GEMM (rows padded to 64)
    gpu0 = float(one(torch.tensor([400])) + one(torch.tensor([10])))
    gpu1 = float(one(torch.tensor([900])) + one(torch.tensor([1]))) / 0.5
    s = eng.summary()
    assert plan.device.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert s["time_gpu_experts_s"] == pytest.approx(max(gpu0, gpu1))
    assert s["n_gpus"] == 2 and s["io_bytes"] == 0 and s["missed_pairs"] == 0 and s["cpu_expert_tokens"] == 0


class NoDevice(System):
    name = "no_device"
    multi_gpu = True
    ignores_budget = True

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        return [set(range(n_experts)) for _ in range(n_layers)]

    def plan(self, layer, load, hint, resident) -> LayerPlan:
        routed = load > 0
        return LayerPlan(gpu=routed, cpu=np.zeros_like(routed), device=self.device)


@pytest.mark.parametrize(
    ("device", "rule"), [(None, "device"), (torch.full((8,), 2), "device"), (torch.zeros(8), "device")]
)
def test_the_engine_rejects_a_multi_gpu_plan_without_a_valid_device_map(device, rule: str) -> None:
    system = NoDevice()
    system.device = device
    eng = OffloadEngine(system, geometry(1, 8), 0, CostModel(geometry(1, 8), HardwareConfig()), topology=multi(1, 1))
    eng.prepare(None)
    eng.begin_step(StepInfo(0, 1, 0, 0, False), 2, 2)
    with pytest.raises(PlanError) as err:
        eng.plan_layer(0, torch.tensor([1, 0, 2, 0, 0, 0, 0, 1]))
    assert err.value.rule == rule


# ---- gem's search ---------------------------------------------------------------------
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    n_gpus=st.integers(2, 4),
    n_experts=st.sampled_from([8, 16]),
    level=st.sampled_from(list(VARIABILITY_SPREAD)),
    tile=st.sampled_from([1, 16, 64]),
    skew=st.floats(0.0, 1.5),
)
def test_gem_never_scores_worse_than_ep_linear_on_its_calibration_window(
    seed: int, n_gpus: int, n_experts: int, level: str, tile: int, skew: float
) -> None:
    gen = torch.Generator().manual_seed(seed)
    geo = geometry(2, n_experts)
    topology = multi(*gpu_speeds(n_gpus, level, seed))
    window = random_loads(gen, 16, 2, n_experts, skew)
    gem = ep_engine("gem", {"tile": tile, "starts": 2}, geo, topology, denoise_trace(window))
    linear = linear_mapping(n_experts, n_gpus)
    cost = gem.cost
    for layer in range(2):
        mapping = gem.system.mappings[layer]
        assert torch.equal(torch.bincount(mapping, minlength=n_gpus), torch.bincount(linear, minlength=n_gpus))
        gem_s, linear_s = (score(cost, topology.speeds, window[:, layer], m) for m in (mapping, linear))
        if tile in (1, 64):  # the curves are the cost model itself (64: the profile's tile): gem's objective
            assert gem_s <= linear_s * (1 + 1e-9)
    report = gem.system.report()
    assert report["calibration_score_s"] <= report["ep_linear_calibration_score_s"] * (1 + 1e-12)


def test_gem_replay_over_its_window_beats_or_ties_ep_linear_through_the_engine() -> None:
    gen = torch.Generator().manual_seed(11)
    geo = geometry(3, 16)
    topology = multi(*gpu_speeds(4, "high", 5))
    window = denoise_trace(random_loads(gen, 16, 3, 16, 1.0))
    times = {}
    for name in ("ep_linear", "gem"):
        eng = ep_engine(name, {"tile": 1} if name == "gem" else {}, geo, topology, window)
        times[name] = eng.replay(window)["time_gpu_experts_s"]
    assert times["gem"] < times["ep_linear"]


def test_gem_keeps_the_heaviest_experts_off_a_gpu_twice_as_slow() -> None:
    # experts 12..15 are routed every step with many tokens; ep_linear puts them all on GPU 3
    gen = torch.Generator().manual_seed(0)
    loads = torch.randint(0, 3, (16, 1, 16), generator=gen) * (torch.rand(16, 1, 16, generator=gen) < 0.3)
    loads[:, 0, 12:] = 250
    topology = multi(1.0, 1.0, 1.0, 0.5)
    gem = ep_engine("gem", {}, geometry(1, 16), topology, denoise_trace(loads))
    mapping = gem.system.mappings[0]
    assert torch.equal(linear_mapping(16, 4)[12:], torch.full((4,), 3))
    assert not (mapping[12:] == 3).any()
    assert torch.bincount(mapping, minlength=4).tolist() == [4, 4, 4, 4]


def test_swaps_stop_at_a_map_no_single_swap_improves() -> None:
    gen = torch.Generator().manual_seed(2)
    costs = torch.rand(3, 5, 9, generator=gen, dtype=torch.float64) * (torch.rand(1, 5, 9, generator=gen) < 0.6)

    def objective(m: torch.Tensor) -> float:
        return sum(max(float(costs[r, s, m == r].sum()) for r in range(3)) for s in range(5))

    start = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    final = improve_by_swaps(costs, start)
    assert objective(final) < objective(start)
    for e, f in itertools.combinations(range(9), 2):
        if final[e] != final[f]:
            swapped = final.clone()
            swapped[[e, f]] = final[[f, e]]
            assert objective(swapped) >= objective(final) * (1 - 1e-9)


def test_gem_needs_a_calibration_trace_and_valid_options() -> None:
    with pytest.raises(HarnessError, match="calibration"):
        ep_engine("gem", {}, geometry(1, 8), multi(1, 1))
    for options in ({"tile": -1}, {"starts": 0}, {"noise": 2.0}, {"calibration_steps": 0}, {"window": "offline"}):
        with pytest.raises(HarnessError, match=f"system.{next(iter(options))}"):
            make_system("gem", options)


# ---- through the engine ---------------------------------------------------------------
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), n_layers=st.integers(1, 3), n_gpus=st.integers(2, 5))
def test_expert_parallel_systems_compute_every_routed_expert_once_on_a_gpu(
    seed: int, n_layers: int, n_gpus: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    geo = geometry(n_layers, 16)
    topology = multi(*gpu_speeds(n_gpus, "medium", seed))
    steps = random_steps(gen, 3)
    calibration = denoise_trace(random_loads(gen, 8, n_layers, 16, 1.0))
    for name in ("ep_linear", "gem"):
        eng = ep_engine(name, {"starts": 1} if name == "gem" else {}, geo, topology, calibration)
        expected = 0.0
        for info in steps:
            eng.begin_step(info, 4, 8)
            for layer in range(n_layers):
                load = random_loads(gen, 1, 1, 16, 0.5)[0, 0]
                plan = eng.plan_layer(layer, load)
                assert np.array_equal(plan.gpu, load.numpy() > 0) and not plan.cpu.any()
                assert eng.layer_resident(layer) == set(range(16))
                busy = [0.0] * n_gpus
                for e in torch.nonzero(load).flatten().tolist():
                    one = float(eng.cost.grouped_gpu_expert_times(load[e:e + 1])[0])
                    busy[int(plan.device[e])] += one / topology.speeds[int(plan.device[e])]
                expected += max(busy)
            eng.end_step()
        s = eng.summary()
        assert (s["missed_pairs"], s["io_bytes"], s["cpu_expert_tokens"], s["time_cpu_experts_s"]) == (0, 0, 0, 0)
        assert s["time_gpu_experts_s"] == pytest.approx(expected)
        assert s["time_gpu_experts_s"] + s["time_non_expert_s"] == pytest.approx(s["modeled_time_s"])


# ---- the grouped-GEMM staircase ---------------------------------------------------------
def test_equal_active_expert_counts_with_different_token_counts_get_different_latencies() -> None:
    """Two mappings of one load over 2 GPUs, each GPU running 2 experts in both: in the first
    GPU 0 holds the two 100-token experts (4 M tiles of 64), in the second each GPU one
    100-token and one 10-token expert (3 tiles each). Same active-expert counts, different
    latencies; the balanced one is faster."""
    geo = geometry(1, 4)
    cost = CostModel(geo, HardwareConfig())
    topology = multi(1.0, 1.0)
    load = torch.tensor([100, 100, 10, 10])
    lumped, balanced = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])
    assert torch.bincount(lumped).tolist() == torch.bincount(balanced).tolist() == [2, 2]
    t_lumped, t_balanced = (topology.layer_time(cost, load, m) for m in (lumped, balanced))
    assert t_balanced < t_lumped
    # the step: one more 64-token tile of tensor-core time on the slower GPU
    tile_s = cost.flops_per_token * 64 / (HardwareConfig().gpu_bf16_tflops * 1e12)
    assert t_lumped - t_balanced == pytest.approx(tile_s)


def test_the_latency_is_a_staircase_at_the_profile_tile() -> None:
    cost = CostModel(geometry(1, 4), HardwareConfig(gpu_gemm_tile=32))
    t = cost.grouped_gpu_expert_times(torch.tensor([0, 1, 32, 33, 64, 65]))
    assert t[0] == 0 and t[1] == t[2] and t[3] == t[4] and t[2] < t[3] < t[5]
    with pytest.raises(HarnessError, match="gpu_gemm_tile"):
        HardwareConfig(gpu_gemm_tile=0)


def test_gem_profiles_at_the_hardware_tile_by_default() -> None:
    gen = torch.Generator().manual_seed(1)
    window = denoise_trace(random_loads(gen, 4, 1, 8, 1.0) * 40)
    gem = ep_engine("gem", {}, geometry(1, 8), multi(1.0, 0.8), window)
    assert gem.system.tile == 64 and gem.system.profiling_cost()["gem_profile_error_max"] == 0.0


# ---- the online profiling window --------------------------------------------------------
def test_online_gem_serves_its_first_forwards_with_ep_linear_then_the_map_searched_on_them() -> None:
    """The first 4 in-block forwards of the served trace are served with ep_linear's map
    and observed; from the 5th GEM serves the map its search finds on exactly those loads
    (what the calibration window finds when the calibration trace is those 4 forwards)."""
    gen = torch.Generator().manual_seed(3)
    geo, topology = geometry(2, 8), multi(1.0, 0.7)
    loads = random_loads(gen, 8, 2, 8, 1.2)
    served = denoise_trace(loads)
    online = ep_engine("gem", {"window": "online", "calibration_steps": 4, "starts": 2}, geo, topology)
    offline = ep_engine("gem", {"calibration_steps": 4, "starts": 2}, geo, topology, denoise_trace(loads[:4]))
    linear = linear_mapping(8, 2)
    for s, info in enumerate(served.steps):
        online.begin_step(info, 8, 8)
        for layer in range(2):
            plan = online.plan_layer(layer, loads[s, layer])
            routed = loads[s, layer] > 0
            want = linear if s < 4 else offline.system.mappings[layer]
            assert torch.equal(torch.from_numpy(np.asarray(plan.device))[routed], want[routed]), (s, layer)
        online.end_step()
    assert online.system.report()["gem_profiling_forwards"] == 4
    assert torch.equal(online.system.mappings, offline.system.mappings)


def test_online_gem_needs_no_calibration_and_stays_linear_on_a_short_run() -> None:
    eng = ep_engine("gem", {"window": "online"}, geometry(1, 8), multi(1.0, 0.5))
    assert torch.equal(eng.system.mappings[0], linear_mapping(8, 2))
    assert eng.system.report()["calibration_gain"] == 0.0
