"""Each system's decisions on hand-made loads, property tests of every system through the
engine on random load sequences, the oracle's exactness and bound, and the registry."""

from __future__ import annotations

import itertools
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from harness.accounting.cost import CostModel, HardwareConfig, expert_shape
from harness.common.errors import HarnessError
from harness.engine.engine import OffloadEngine
from harness.placement.plan import move_count, move_ids
from harness.placement.trace import RoutingTrace
from systems.fiddler import Fiddler
from systems.oracle import best_gpu_set
from systems.registry import SYSTEM_CONFIGS, SYSTEMS, make_system, system_from_config
from systems.tide import Tide
from tests.conftest import REPO
from tests.system_drive import engine, geometry, loads, step

CONF = REPO / "conf" / "system"


# ---- tide ------------------------------------------------------------------------------
def test_tide_tau3_refreshes_at_0_3_6_and_every_step_of_the_first_block() -> None:
    tide = Tide(tau=3)
    seen = []
    g = 0
    for block, n_steps in ((0, 4), (1, 8), (2, 8)):
        for s in range(n_steps):
            tide.on_step(step(block, s, g, first=block == 0))
            seen.append((block, s, tide.refreshing))
            g += 1
    refreshed = {(b, s) for b, s, r in seen if r}
    assert refreshed == {(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 3), (1, 6), (2, 0), (2, 3), (2, 6)}
    assert tide.should_refresh(step(1, 0, 0, kind="prefill"))
    assert not tide.should_refresh(step(1, 0, 0, kind="commit"))
    assert not tide.should_refresh(step(0, 4, 0, first=True, kind="commit"))


def test_tide_moves_weights_only_at_refreshes_and_holds_the_top_b() -> None:
    geo = geometry(1, 8)
    eng = engine("tide", {"tau": 3}, geo, 2)
    gen = torch.Generator().manual_seed(0)
    for s in range(8):
        eng.begin_step(step(1, s, s), 4, 4)
        load = torch.randint(0, 6, (8,), generator=gen)
        plan = eng.plan_layer(0, load)
        if s % 3:
            assert not (move_count(plan.fetch_sync) or move_count(plan.evict) or move_count(plan.fetch_async))
        else:
            top2 = sorted(range(8), key=lambda e: (-int(load[e]), e))[:2]
            assert set(top2) <= eng.layer_resident(0)
        eng.end_step()


def test_tide_demotes_only_as_many_as_needed_lowest_load_first() -> None:
    geo = geometry(1, 8)
    load = loads(8, e0=9, e5=8, e1=1)  # target = {0, 5, 1}: only three experts routed
    for migration in ("sync", "async"):
        eng = OffloadEngine(
            make_system("tide", {"tau": 2, "migration": migration}), geo, 4, CostModel(geo, HardwareConfig())
        )
        eng.prepare(None)  # initial residency {0, 1, 2, 3}
        eng.begin_step(step(1, 0, 0), 3, 3)
        plan = eng.plan_layer(0, load)
        assert move_ids(plan.evict).tolist() == [2]  # 2 and 3 are idle; one slot is needed; the lower id goes
        assert eng.layer_resident(0) == {0, 1, 3, 5}
        if migration == "sync":
            assert move_ids(plan.fetch_sync).tolist() == [5] and np.flatnonzero(plan.gpu).tolist() == [0, 1, 5]
        else:
            assert move_ids(plan.fetch_async).tolist() == [5] and np.flatnonzero(plan.gpu).tolist() == [0, 1]
            assert np.flatnonzero(plan.cpu).tolist() == [5]


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"tau": 0}, "system.tau"),
        ({"tau": "often"}, "system.tau"),
        ({"tau": -2}, "system.tau"),
        ({"migration": "foo"}, "system.migration"),
        ({"steps_per_block": 0}, "system.steps_per_block"),
    ],
)
def test_tide_rejects_invalid_options(options: dict, key: str) -> None:
    with pytest.raises(HarnessError, match=re.escape(key)):
        make_system("tide", options)


def test_tide_accepts_tau_as_int_or_string() -> None:
    assert make_system("tide", {"tau": 4}).fixed_tau == 4
    assert make_system("tide", {"tau": "4"}).fixed_tau == 4
    assert make_system("tide", {"tau": "auto"}).fixed_tau is None


# ---- fiddler ---------------------------------------------------------------------------
def test_fiddler_cpu_or_copy_rule_on_both_sides_of_the_crossover() -> None:
    geo = geometry(1, 8)
    cost = CostModel(geo, HardwareConfig())
    crossover = next(
        n for n in range(1, 10_000) if cost.cpu_expert_time(n) > cost.copy_time(1) + cost.gpu_expert_time(n)
    )
    assert 20 < crossover < 500  # a real crossover under the A100 profile
    trace = RoutingTrace(1, 8)
    trace.add_step(step(0, 0, 0))
    trace.record(0, loads(8, e6=5, e3=9))  # popularity: 3 then 6
    eng = engine("fiddler", {}, geo, 2, calibration=trace)
    assert eng.layer_resident(0) == {3, 6}
    assert eng.system.prefers_cpu(crossover - 1) and not eng.system.prefers_cpu(crossover)
    for _ in range(2):
        eng.begin_step(step(1, 0, 0), crossover, crossover)
        plan = eng.plan_layer(0, loads(8, e0=crossover - 1, e1=crossover, e3=4))
        assert np.flatnonzero(plan.cpu).tolist() == [0]
        assert np.flatnonzero(plan.gpu).tolist() == [1, 3]
        ids = plan.with_lists()
        assert ids.scratch == [1] and ids.fetch_sync == [1] and not ids.evict
        assert eng.layer_resident(0) == {3, 6}  # placement never changes
        eng.end_step()


def test_fiddler_needs_calibration() -> None:
    with pytest.raises(HarnessError, match="calibration"):
        engine("fiddler", {}, geometry(1, 8), 2)


# ---- static_split ------------------------------------------------------------------------
def test_static_split_keeps_the_calibration_top_b_and_sends_every_miss_to_the_cpu() -> None:
    """Even a miss heavy enough for fiddler to copy runs on the CPU: nothing ever moves."""
    geo = geometry(1, 8)
    trace = RoutingTrace(1, 8)
    trace.add_step(step(0, 0, 0))
    trace.record(0, loads(8, e6=5, e3=9))
    eng = engine("static_split", {}, geo, 2, calibration=trace)
    assert eng.layer_resident(0) == {3, 6} and eng.system.overlap
    for _ in range(2):
        eng.begin_step(step(1, 0, 0), 5000, 5000)
        plan = eng.plan_layer(0, loads(8, e0=5000, e3=4, e6=1, e7=2))
        assert np.flatnonzero(plan.gpu).tolist() == [3, 6] and np.flatnonzero(plan.cpu).tolist() == [0, 7]
        assert not (move_count(plan.fetch_sync) or move_count(plan.evict) or move_count(plan.prefetch))
        eng.end_step()
    assert eng.layer_resident(0) == {3, 6}
    assert eng.counters.copies_sync == eng.counters.copies_scratch == 0


def test_static_split_needs_calibration() -> None:
    with pytest.raises(HarnessError, match="static_split needs a calibration"):
        engine("static_split", {}, geometry(1, 8), 2)


# ---- mixtral_offload -------------------------------------------------------------------
def test_mixtral_lru_order_eviction_and_scratch() -> None:
    eng = engine("mixtral_offload", {}, geometry(1, 8), 3)
    expected = [  # (load, evict (the least recent; listed by id), fetch_sync, scratch, resident after)
        (loads(8, e3=1), [0], [3], [], {1, 2, 3}),
        (loads(8, e1=1, e4=1), [2], [4], [], {1, 3, 4}),  # 1 refreshed: 2 is now least recent
        (loads(8, e5=1, e6=1), [1, 3], [5, 6], [], {4, 5, 6}),
        (loads(8, e0=1, e1=1, e2=1, e3=1), [4, 5, 6], [0, 1, 2, 3], [3], {0, 1, 2}),
    ]
    for g, (load, evict, fetch, scratch, after) in enumerate(expected):
        eng.begin_step(step(1, g, g), 2, 2)
        plan = eng.plan_layer(0, load)
        ids = plan.with_lists()
        assert (ids.evict, ids.fetch_sync, ids.scratch) == (evict, fetch, scratch)
        assert np.array_equal(plan.gpu, load.numpy() > 0) and not plan.cpu.any()
        assert eng.layer_resident(0) == after
        eng.end_step()


def test_mixtral_prefetch_fills_the_next_layer_from_the_hint() -> None:
    eng = engine("mixtral_offload", {"prefetch": True, "prefetch_k": 1}, geometry(2, 8), 2)
    eng.begin_step(step(1, 0, 0), 2, 2)
    hint = torch.tensor([0.5, 0.1, 0, 0, 0, 0, 3.0, 0])  # layer 1 will want expert 6
    plan = eng.plan_layer(0, loads(8, e0=1), hint)
    assert plan.prefetch == [6] and plan.prefetch_evict == [0]
    assert eng.layer_resident(1) == {1, 6}
    plan1 = eng.plan_layer(1, loads(8, e6=2))
    assert not move_count(plan1.fetch_sync)
    eng.end_step()
    s = eng.summary()
    assert s["copies_async"] == 1 and s["missed_pairs"] == 0


# ---- oracle ----------------------------------------------------------------------------
def test_oracle_holds_the_top_b_of_each_step() -> None:
    eng = engine("oracle", {}, geometry(1, 8), 2)
    for g, (a, b, c) in enumerate([(0, 1, 2), (5, 6, 7), (3, 6, 0), (2, 4, 1)]):
        eng.begin_step(step(1, g, g), 40, 40)
        load = loads(8, **{f"e{a}": 50, f"e{b}": 40, f"e{c}": 1})
        plan = eng.plan_layer(0, load)
        assert eng.layer_resident(0) == {a, b}
        assert np.flatnonzero(plan.gpu).tolist() == sorted([a, b])
        assert np.flatnonzero(plan.cpu).tolist() == [c]  # one token: cheaper on the idle CPU
        eng.end_step()
    assert eng.summary()["io_bytes"] == 0  # its moves are free


def _phi(subset: set[int], load: torch.Tensor, capacity: int, cost: CostModel) -> float:
    routed = [e for e in range(len(load)) if load[e] > 0]
    gpu = sum(cost.gpu_expert_time(int(load[e])) for e in subset)
    cpu = sum(cost.cpu_expert_time(int(load[e])) for e in routed if e not in subset)
    return max(cost.copy_time(max(0, len(subset) - capacity)) + gpu, cpu)


TABLE_HW = HardwareConfig(
    cpu_table_shape=expert_shape(geometry()),
    cpu_table_tokens=[1, 4, 16, 64],
    cpu_table_seconds=[2e-4, 2.5e-4, 6e-4, 2e-3],
)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n_routed=st.integers(0, 9),
    capacity=st.integers(0, 6),
    heavy=st.booleans(),
    table=st.booleans(),
)
def test_oracle_split_is_the_exact_optimum(
    seed: int, n_routed: int, capacity: int, heavy: bool, table: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    load = torch.zeros(12, dtype=torch.long)
    ids = torch.randperm(12, generator=gen)[:n_routed]
    high = 900 if heavy else 60
    load[ids] = torch.randint(1, high, (n_routed,), generator=gen)
    cost = CostModel(geometry(1, 12), TABLE_HW if table else HardwareConfig())
    chosen, value, exact = best_gpu_set(load.numpy(), capacity, cost)
    routed = ids.tolist()
    brute = min(
        _phi(set(s), load, capacity, cost)
        for r in range(n_routed + 1)
        for s in itertools.combinations(routed, r)
    )
    assert exact
    assert value == pytest.approx(_phi(set(chosen), load, capacity, cost), rel=1e-9)
    assert value == pytest.approx(brute, rel=1e-9, abs=1e-15)


def test_oracle_flags_layers_it_cannot_solve_exactly() -> None:
    # a GPU ridge of ~5 tokens puts heavy experts inside the CPU table's kinks: not affine
    hw = HardwareConfig(
        gpu_bf16_tflops=10.0,
        cpu_table_shape=TABLE_HW.cpu_table_shape,
        cpu_table_tokens=[1, 8, 16, 64],
        cpu_table_seconds=[2e-4, 2.2e-4, 9e-4, 1e-3],
    )
    cost = CostModel(geometry(1, 12), hw)
    load = loads(12, e0=10, e1=20, e2=40, e3=1)
    chosen, value, exact = best_gpu_set(load.numpy(), 1, cost)
    assert not exact and set(chosen) >= {0, 1, 2}  # every heavy expert on the GPU
    assert value == pytest.approx(_phi(set(chosen), load, 1, cost))


# ---- registry --------------------------------------------------------------------------
def test_registry_names_and_errors() -> None:
    assert set(SYSTEMS) == set(SYSTEM_CONFIGS)
    assert {"gpu_only", "fiddler", "mixtral_offload", "tide", "oracle"} <= set(SYSTEMS)
    with pytest.raises(HarnessError, match="known: gpu_only, fiddler"):
        make_system("flexgen", {})
    with pytest.raises(HarnessError, match="allowed"):
        make_system("tide", {"tau": 3, "rate": 1})
    with pytest.raises(HarnessError, match="name"):
        make_system("tide", {"name": "fiddler"})
    with pytest.raises(HarnessError, match=r"system\.prefetch"):
        make_system("mixtral_offload", {"prefetch": "yes"})
    with pytest.raises(HarnessError, match=r"system\.prefetch_k"):
        make_system("mixtral_offload", {"prefetch_k": 0})
    structured = OmegaConf.merge(
        OmegaConf.structured(SYSTEM_CONFIGS["tide"]), {"tau": 5, "migration": "async"}
    )
    tide = make_system("tide", structured)
    assert tide.fixed_tau == 5 and tide.migration == "async"


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_system_yaml_keys_match_the_config_classes(path: Path) -> None:
    raw = OmegaConf.load(path)
    if raw.get("name") not in SYSTEM_CONFIGS:
        pytest.skip(f"{path.name} is not a system of this registry")
    assert list(raw.pop("defaults")) == [f"{raw.name}_schema", "_self_"]  # the node is typed by its schema
    schema = SYSTEM_CONFIGS[raw.name]
    defaults = {f.name: f.default for f in fields(schema)}
    assert set(raw.keys()) <= set(defaults)
    # defaults live in the dataclass: the file holds only what differs from them
    assert [key for key in raw if key != "name" and raw[key] == defaults[key]] == []
    config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), raw))
    assert isinstance(config, schema)
    system_from_config(config)


def test_fiddler_initial_residency_is_each_layers_top_b_by_popularity() -> None:
    trace = RoutingTrace(2, 8)
    trace.add_step(step(0, 0, 0))
    trace.record(0, loads(8, e7=3, e2=3, e5=1))
    trace.record(1, loads(8, e4=1))
    fiddler = Fiddler()
    eng = OffloadEngine(fiddler, geometry(2, 8), 2, CostModel(geometry(2, 8), HardwareConfig()))
    eng.prepare(trace)
    assert eng.layer_resident(0) == {2, 7}
    assert eng.layer_resident(1) == {0, 4}  # never-routed experts fill by id
