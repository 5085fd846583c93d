"""The engine: plan validation (one test per rule), counters and charges of a hand-made
plan, lossless execution, trace recording and live/replay agreement."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.engine.engine import OffloadEngine, PlanError
from harness.model.config import LLaDA2Config
from harness.model.experts import ExpertWeights, LocalExperts, compute_routed_experts
from harness.placement.plan import ID_LISTS, LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import System
from harness.placement.trace import RoutingTrace
from systems.registry import make_system

E, B = 8, 2
GEOMETRY = LLaDA2Config(num_hidden_layers=3, num_experts=E, n_group=1, topk_group=1, num_experts_per_tok=2)
COST = CostModel(GEOMETRY, HardwareConfig())
LOAD = torch.tensor([1, 0, 2, 3, 0, 0, 0, 0])  # experts 0 (resident), 2 and 3 (not) routed
STEP = StepInfo(prompt=0, block=0, step=0, global_step=0, is_first_block=True)


def mask(*ids: int, n: int = E) -> np.ndarray:
    out = np.zeros(n, bool)
    out[list(ids)] = True
    return out


class Scripted(System):
    """A deliberately broken system: answers whatever plan the test hands it."""

    name = "scripted"

    def __init__(
        self, make_plan: Callable[[int], LayerPlan], initial: int = B, overlap: bool = False
    ) -> None:
        super().__init__()
        self.make_plan, self.initial, self.overlap = make_plan, initial, overlap

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        return [set(range(self.initial)) for _ in range(n_layers)]

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        return self.make_plan(layer)


def engine_for(
    system: System, experts_per_layer: int = B, trace: RoutingTrace | None = None
) -> OffloadEngine:
    engine = OffloadEngine(system, GEOMETRY, experts_per_layer, COST, trace=trace)
    engine.prepare(None)
    return engine


BAD_PLANS: dict[str, Callable[[], LayerPlan]] = {
    "shape": lambda: LayerPlan(gpu=np.zeros(E - 1, bool), cpu=mask(2, 3)),
    "bad-id": lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), fetch_async=[E + 1]),
    "duplicate": lambda: LayerPlan(gpu=mask(0, 2), cpu=mask(3), fetch_sync=[2, 2]),
    "computed-twice": lambda: LayerPlan(gpu=mask(0, 2), cpu=mask(2, 3), fetch_sync=[2], evict=[1]),
    "routed-not-computed": lambda: LayerPlan(gpu=mask(0), cpu=mask(2)),
    "unrouted-computed": lambda: LayerPlan(gpu=mask(0, 1), cpu=mask(2, 3)),
    "evict-not-resident": lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), evict=[5]),
    "fetch-resident": lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), fetch_sync=[1]),
    "scratch-not-sync": lambda: LayerPlan(gpu=mask(0, 2), cpu=mask(3), scratch=[2]),
    "scratch-not-gpu": lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), fetch_sync=[2], scratch=[2]),
    "evicted-computed-on-gpu": lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), evict=[0]),
    "gpu-not-resident": lambda: LayerPlan(gpu=mask(0, 2), cpu=mask(3)),
    "capacity": lambda: LayerPlan(gpu=mask(0, 2), cpu=mask(3), fetch_sync=[2]),
}


@pytest.mark.parametrize("rule", list(BAD_PLANS))
def test_engine_rejects_a_plan_breaking_each_rule(rule: str) -> None:
    engine = engine_for(Scripted(lambda layer: BAD_PLANS[rule]()))
    engine.begin_step(STEP, 3, 3)
    with pytest.raises(PlanError) as err:
        engine.plan_layer(0, LOAD)
    assert err.value.rule == rule
    assert "scripted" in str(err.value) and "layer 0" in str(err.value)


def as_masks(plan: LayerPlan) -> LayerPlan:
    """The same plan with each of its non-empty id fields as a bool mask [E]."""
    return dataclasses.replace(plan, **{name: mask(*getattr(plan, name)) for name in ID_LISTS
                                        if len(getattr(plan, name))})


@pytest.mark.parametrize("rule", [r for r in BAD_PLANS if r not in ("shape", "bad-id", "duplicate")])
def test_a_plan_with_mask_fields_breaks_the_same_rules(rule: str) -> None:
    engine = engine_for(Scripted(lambda layer: as_masks(BAD_PLANS[rule]())))
    engine.begin_step(STEP, 3, 3)
    with pytest.raises(PlanError) as err:
        engine.plan_layer(0, LOAD)
    assert err.value.rule == rule


def test_an_async_fetch_cannot_be_computed_on_the_gpu_in_the_same_plan() -> None:
    plan = LayerPlan(gpu=mask(0, 2), cpu=mask(3), fetch_async=[2], evict=[1])
    engine = engine_for(Scripted(lambda layer: plan))
    engine.begin_step(STEP, 3, 3)
    with pytest.raises(PlanError, match="gpu-not-resident"):
        engine.plan_layer(0, LOAD)


def test_scratch_copies_do_not_count_towards_capacity() -> None:
    plan = LayerPlan(gpu=mask(0, 2, 3), cpu=mask(), fetch_sync=[2, 3], scratch=[2, 3])
    engine = engine_for(Scripted(lambda layer: plan))
    engine.begin_step(STEP, 3, 3)
    engine.plan_layer(0, LOAD)
    assert engine.layer_resident(0) == {0, 1}
    assert engine.summary()["copies_scratch"] == 2


PREFETCH_PLANS: dict[str, tuple[int, Callable[[], LayerPlan]]] = {
    "prefetch-last-layer": (1, lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), prefetch=[5])),
    "prefetch-evict-not-resident": (0, lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), prefetch_evict=[5])),
    "prefetch-resident": (
        0,
        lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), prefetch=[1], prefetch_evict=[0]),
    ),
    "prefetch-capacity": (0, lambda: LayerPlan(gpu=mask(0), cpu=mask(2, 3), prefetch=[5])),
}


@pytest.mark.parametrize("rule", list(PREFETCH_PLANS))
def test_engine_rejects_bad_prefetches(rule: str) -> None:
    layer, make = PREFETCH_PLANS[rule]
    engine = engine_for(Scripted(lambda _: make()))
    engine.begin_step(STEP, 3, 3)
    with pytest.raises(PlanError) as err:
        engine.plan_layer(layer, LOAD)
    assert err.value.rule == rule


def test_initial_residency_above_capacity_is_rejected() -> None:
    with pytest.raises(PlanError, match="initial-residency"):
        engine_for(Scripted(lambda layer: LayerPlan(gpu=mask(), cpu=mask()), initial=B + 1))


def test_prepare_must_come_first() -> None:
    engine = OffloadEngine(Scripted(lambda layer: LayerPlan(gpu=mask(), cpu=mask())), GEOMETRY, B, COST)
    with pytest.raises(RuntimeError, match="prepare"):
        engine.begin_step(STEP, 1, 1)


@pytest.mark.parametrize("overlap", [False, True])
def test_counters_and_charges_of_a_hand_made_plan(overlap: bool) -> None:
    plan = LayerPlan(gpu=mask(0, 2), cpu=mask(3), fetch_sync=[2], evict=[1])
    engine = engine_for(Scripted(lambda layer: plan, overlap=overlap))
    engine.begin_step(STEP, 3, 3)
    engine.plan_layer(0, LOAD)
    engine.end_step()
    s = engine.summary()
    assert engine.layer_resident(0) == {0, 2}
    assert (s["routed_pairs"], s["missed_pairs"], s["cpu_expert_tokens"]) == (6, 5, 3)
    assert (s["copies_sync"], s["copies_async"], s["copies_scratch"]) == (1, 0, 0)
    assert s["io_bytes"] == GEOMETRY.expert_bytes()
    gpu = COST.gpu_expert_time(1) + COST.gpu_expert_time(2)
    cpu = COST.cpu_expert_time(3)
    layer = COST.combine(gpu, COST.copy_time(1), cpu, overlap)
    assert s["time_non_expert_s"] == pytest.approx(COST.non_expert_time(3, 3))
    assert s["modeled_time_s"] == pytest.approx(COST.non_expert_time(3, 3) + layer)
    split = s["time_gpu_experts_s"] + s["time_cpu_experts_s"] + s["time_copies_s"] + s["time_non_expert_s"]
    assert split == pytest.approx(s["modeled_time_s"])
    assert s["step_series"][0]["miss_rate"] == pytest.approx(5 / 6)
    assert s["step_series"][0]["modeled_latency_s"] == pytest.approx(s["modeled_time_s"])


def _experts(n: int, hidden: int = 16, inter: int = 8, seed: int = 0) -> list[ExpertWeights]:
    gen = torch.Generator().manual_seed(seed)
    return [
        ExpertWeights(
            *(
                torch.randn(shape, generator=gen)
                for shape in ((inter, hidden), (inter, hidden), (hidden, inter))
            )
        )
        for _ in range(n)
    ]


def _routing(n_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E, generator=gen)[:2] for _ in range(n_tokens)])
    return idx, torch.rand(n_tokens, 2, generator=gen)


def _calibration() -> RoutingTrace:
    trace = RoutingTrace(GEOMETRY.n_moe_layers, E)
    gen = torch.Generator().manual_seed(7)
    for s in range(6):
        trace.add_step(StepInfo(0, s // 3, s % 3, s, s < 3))
        for layer in range(GEOMETRY.n_moe_layers):
            trace.record(layer, torch.randint(0, 4, (E,), generator=gen))
    return trace


SYSTEM_OPTIONS = [
    ("gpu_only", {}),
    ("fiddler", {}),
    ("mixtral_offload", {}),
    ("mixtral_offload", {"prefetch": True, "prefetch_k": 2}),
    ("tide", {"tau": 2}),
    ("tide", {"tau": "auto", "migration": "async"}),
    ("oracle", {}),
    ("dali", {}),
    ("dali", {"predictor": "next_gate"}),
]


def _live(
    name: str, options: dict, trace: RoutingTrace | None, n_steps: int = 4
) -> tuple[OffloadEngine, list]:
    engine = OffloadEngine(make_system(name, options), GEOMETRY, B, COST, trace=trace)
    engine.prepare(_calibration())
    experts = _experts(E)
    outputs = []
    for s in range(n_steps):
        engine.begin_step(StepInfo(0, s // 2, s % 2, s, s < 2), 5, 5 + s)
        for layer in range(GEOMETRY.n_moe_layers):
            x = torch.randn(5, 16, generator=torch.Generator().manual_seed(100 * s + layer))
            idx, w = _routing(5, 100 * s + layer)
            last = layer + 1 == GEOMETRY.n_moe_layers
            # the two channels differ (residual rolled one further), so a system reading the wrong one shows
            hint_fn = None if last else (
                lambda channel, s=s, layer=layer: torch.arange(E).float().roll(s + layer + (channel == "residual")))
            out = engine.run_experts(layer, x, idx, w, experts, hint_fn)
            outputs.append(
                (
                    out,
                    LocalExperts().run_experts(layer, x, idx, w, experts, None),
                    compute_routed_experts(x, idx, w, experts),
                )
            )
        engine.end_step()
    return engine, outputs


@pytest.mark.parametrize(("name", "options"), SYSTEM_OPTIONS)
def test_every_system_is_bit_identical_to_in_place_compute(name: str, options: dict) -> None:
    _, outputs = _live(name, options, None)
    for out, local, reference in outputs:
        assert torch.equal(out, local) and torch.equal(out, reference)


@pytest.mark.parametrize(("name", "options"), SYSTEM_OPTIONS)
def test_live_and_replay_give_identical_counters(name: str, options: dict) -> None:
    trace = RoutingTrace(GEOMETRY.n_moe_layers, E)
    live, _ = _live(name, options, trace)
    assert len(trace) == 4 and int(trace.loads[0].sum()) == 5 * 2 * GEOMETRY.n_moe_layers
    replay = OffloadEngine(make_system(name, options), GEOMETRY, B, COST)
    replay.prepare(_calibration())
    assert trace.n_tokens == [5] * 4 and trace.n_context == [5, 6, 7, 8]
    replayed = replay.replay(trace)
    assert replayed == live.summary()


def test_gpu_only_holds_every_expert_and_never_misses() -> None:
    engine, _ = _live("gpu_only", {}, None)
    s = engine.summary()
    assert (
        s["capacity"] == E and s["missed_pairs"] == 0 and s["io_bytes"] == 0 and s["cpu_expert_tokens"] == 0
    )


def test_a_plan_with_torch_masks_is_refused_with_the_fix() -> None:
    torch_plan = LayerPlan(gpu=torch.from_numpy(mask(0, 2)), cpu=torch.from_numpy(mask(3)), fetch_sync=[2], evict=[1])
    engine = engine_for(Scripted(lambda layer: torch_plan))
    engine.begin_step(STEP, 3, 3)
    with pytest.raises(PlanError, match=r"numpy bool array \[8\] \(a torch tensor: pass mask.numpy\(\)\)"):
        engine.plan_layer(0, LOAD)


@pytest.mark.parametrize(("ids", "rule"), [(np.array([2]), None), (np.array([-1]), "bad-id"),
                                           (np.array([2, 2]), "duplicate"), (np.array([2.0]), "bad-id"),
                                           ([True], "bad-id"), (mask(2), None),
                                           (np.zeros(E - 1, bool), "bad-id")])
def test_id_lists_may_be_arrays_or_masks_and_are_checked_as_lists(ids, rule) -> None:
    plan = LayerPlan(gpu=mask(0, 2), cpu=mask(3), fetch_sync=ids, evict=np.array([1]))  # valid: fetch 2, evict 1
    engine = engine_for(Scripted(lambda layer: plan))
    engine.begin_step(STEP, 3, 3)
    if rule is None:
        engine.plan_layer(0, LOAD)
        assert engine.layer_resident(0) == {0, 2}
    else:
        with pytest.raises(PlanError) as err:
            engine.plan_layer(0, LOAD)
        assert err.value.rule == rule


@pytest.mark.parametrize("as_numpy", [False, True])
def test_a_system_reads_the_load_but_cannot_change_it(as_numpy: bool) -> None:
    def meddling(layer: int, load: np.ndarray, hint: object, resident: np.ndarray) -> LayerPlan:
        load[1] = 5  # the ledger records the load after the plan: a change would falsify it
        return LayerPlan(gpu=mask(0), cpu=mask(2, 3))

    system = Scripted(lambda layer: LayerPlan(gpu=mask(0), cpu=mask(2, 3)))
    system.plan = meddling  # type: ignore[method-assign]
    engine = engine_for(system)
    engine.begin_step(STEP, 3, 3)
    load = LOAD.numpy().copy() if as_numpy else LOAD.clone()  # writable: the engine hands on a read-only view
    with pytest.raises(ValueError, match="read-only"):
        engine.plan_layer(0, load)
    assert int(load[1]) == 0


def test_a_system_reads_its_residency_but_cannot_change_it() -> None:
    def meddling(layer: int, load: np.ndarray, hint: object, resident: np.ndarray) -> LayerPlan:
        resident[5] = True  # a system must not move residency behind the engine's back
        return LayerPlan(gpu=mask(0), cpu=mask(2, 3))

    system = Scripted(lambda layer: LayerPlan(gpu=mask(0), cpu=mask(2, 3)))
    system.plan = meddling  # type: ignore[method-assign]
    engine = engine_for(system)
    engine.begin_step(STEP, 3, 3)
    with pytest.raises(ValueError, match="read-only"):
        engine.plan_layer(0, LOAD)
    assert engine.layer_resident(0) == {0, 1}
