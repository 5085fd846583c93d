"""The batch replay (harness/traces/batch_replay.py: a system's batch planner, charged by the
ledger) gives the engine's layer-by-layer summary, system report and residency (ints
equal, floats to 1e-9 relative, and in fact bit for bit with this torch): each batch
planner decides what its system's `plan` decides. The engine replays whatever does not
plan in batch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.accounting.bitsets import pack, popcount, unpack
from harness.accounting.cost import CostModel, HardwareConfig, expert_shape
from harness.bench import synthetic_trace
from harness.cli.overrides import compose_checked
from harness.engine.engine import OffloadEngine
from harness.job.artifacts import record_trace
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.placement.trace import RoutingTrace
from harness.traces.batch_replay import batch_refusal, replay_trace, summary_differences
from harness.zoo.entry import load_model, nominal_geometry
from systems.registry import make_system
from systems.tide import Tide

register_configs()

VARIANTS = {
    "fiddler": ("fiddler", {}),
    "tide-1": ("tide", {"tau": 1}),
    "tide-3": ("tide", {"tau": 3}),
    "tide-auto": ("tide", {"tau": "auto"}),
    "tide-random": ("tide", {"tau": "random", "steps_per_block": 8, "seed": 3}),
    "tide-1-async": ("tide", {"tau": 1, "migration": "async"}),
    "tide-3-async": ("tide", {"tau": 3, "migration": "async"}),
    "tide-auto-async": ("tide", {"tau": "auto", "migration": "async"}),
    "tide-random-async": ("tide", {"tau": "random", "steps_per_block": 8, "migration": "async"}),
}
# 24: every refresh fills the budget; 200: more room than routed experts, so refreshes
# demote only some of the non-target residents (refresh_bits' partial rows)
BUDGETS = (24, 200)


def geometry(model: str):
    return nominal_geometry(compose_checked([f"model={model}"]).model)


def varied_cost_hardware(g) -> HardwareConfig:
    """A measured CPU table (as hardware=local writes) and a slow GPU: expert times differ
    with the load on both devices, so seconds are summed value by value, not per count."""
    hw = HardwareConfig(name="varied", gpu_bf16_tflops=0.5, cpu_table_shape=expert_shape(g),
                        cpu_table_tokens=[1, 2, 4, 16], cpu_table_seconds=[3e-4, 3.5e-4, 6e-4, 2e-3])
    cost = CostModel(g, hw)
    assert cost.gpu_expert_time(1) != cost.gpu_expert_time(2) and cost.cpu_expert_time(1) != cost.cpu_expert_time(2)
    return hw


def replay_both(name, options, g, budget, cost, trace, calibration=None):
    """(engine, fast) x (summary, report, residency, mode) of fresh systems over `trace`."""
    out = []
    for allow_batch in (False, True):
        system = make_system(name, options)
        engine = OffloadEngine(system, g, budget, cost)
        engine.prepare(calibration or trace if system.needs_calibration else None, 8)
        summary, mode = replay_trace(engine, trace, allow_batch=allow_batch)
        out.append((summary, system.report(), [sorted(s) for s in engine.resident], mode))
    return out


def assert_same_replay(engine_run, fast_run):
    assert engine_run[3] == "engine" and fast_run[3] == "fast"
    assert summary_differences(engine_run[0], fast_run[0]) == []
    assert fast_run[1] == engine_run[1]  # refreshes, migrated experts, tau per block, tau* ...
    assert fast_run[2] == engine_run[2]  # residency left on the engine


@pytest.fixture(scope="module")
def tiny_synthetic():
    g = geometry("tiny")
    return g, synthetic_trace(g, steps=40, tokens=16, block=8, seed=1)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_replay_equals_engine_on_a_synthetic_trace(variant, budget, tiny_synthetic):
    g, trace = tiny_synthetic
    name, options = VARIANTS[variant]
    engine_run, fast_run = replay_both(name, options, g, budget, CostModel(g, HardwareConfig()), trace)
    assert_same_replay(engine_run, fast_run)
    assert fast_run[0]["missed_pairs"] > 0  # the comparison is not vacuous
    if name == "tide":  # weights moved, by the copies the migration option names
        assert fast_run[1]["migrated_experts"] > 0
        assert (fast_run[0]["copies_sync"] > 0) == (options.get("migration", "sync") == "sync")
    else:
        assert fast_run[0]["copies_scratch"] + fast_run[0]["cpu_expert_tokens"] > 0


@pytest.mark.parametrize("variant", ["fiddler", "tide-3", "tide-1-async", "tide-random"])
def test_fast_replay_equals_engine_over_many_layers_and_varied_expert_times(variant):
    g = geometry("mini")  # 19 MoE layers: the timeline runs layer after layer
    trace = synthetic_trace(g, steps=20, tokens=24, block=8, seed=2)
    name, options = VARIANTS[variant]
    engine_run, fast_run = replay_both(name, options, g, 64, CostModel(g, varied_cost_hardware(g)), trace)
    assert_same_replay(engine_run, fast_run)


@pytest.fixture(scope="module")
def recorded_tiny(tmp_path_factory, proxy_cache, tiny_dir):
    """A gpu_only trace of the tiny proxy (prefill, denoise and commit forwards), saved and
    loaded back, and a second one of another prompt as calibration."""
    overrides = ["model=tiny", "decode.gen_length=16", "decode.block_length=8", "decode.steps=8",
                 f"cache_dir={proxy_cache}", "tracking.enabled=false"]
    cfg = compose_checked(overrides)
    loaded = load_model(cfg.model, cfg.cache_dir)
    settings = cfg.decode
    out = tmp_path_factory.mktemp("recorded")
    paths = []
    for name, prompt in (("trace", "Write a function that reverses a list."), ("calibration", "Sort a dict.")):
        trace, _ = record_trace(loaded, cfg, [prompt], settings, name)
        paths.append(trace.save(out / f"{name}.npz"))
    return overrides, paths[0], RoutingTrace.load(paths[0]), RoutingTrace.load(paths[1])


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_replay_equals_engine_on_a_recorded_trace(variant, budget, recorded_tiny):
    _, _, trace, calibration = recorded_tiny
    assert {s.kind for s in trace.steps} == {"prefill", "denoise", "commit"}
    g = geometry("tiny")
    name, options = VARIANTS[variant]
    engine_run, fast_run = replay_both(name, options, g, budget, CostModel(g, HardwareConfig()), trace, calibration)
    assert_same_replay(engine_run, fast_run)


@pytest.mark.parametrize("variant", ["fiddler", "tide-auto", "tide-3-async"])
def test_fast_replay_is_bit_identical_with_this_torch(variant, recorded_tiny):
    """Not only 1e-9: each layer's seconds are summed as torch sums them and each counter in
    the engine's order, so live/replay parity (tests/integration/test_replay.py) can compare with ==."""
    _, _, trace, calibration = recorded_tiny
    g = geometry("tiny")
    name, options = VARIANTS[variant]
    engine_run, fast_run = replay_both(name, options, g, 24, CostModel(g, varied_cost_hardware(g)), trace,
                                       calibration)
    assert summary_differences(engine_run[0], fast_run[0], rel=0.0) == []


def test_run_replay_records_which_replay_ran(recorded_tiny, tmp_path):
    overrides, path, _, _ = recorded_tiny
    for system, mode in (("tide", "fast"), ("mixtral_offload", "engine")):
        cfg = compose_checked([*overrides, f"system={system}", "source=trace", f"trace.path={path}",
                               "budget=custom", "budget.experts_per_layer=24"])
        result = run_job(cfg, tmp_path / system)
        assert result["replay"] == mode
        assert result["metrics"]["layer_steps_per_s"] > 0 and result["metrics"]["routed_pairs"] > 0


# ---- fallbacks ------------------------------------------------------------------------
class PickyTide(Tide):
    """A subclass may decide differently: the fast path must not assume it does not."""


def test_unsupported_engines_replay_through_the_engine(tiny_synthetic):
    g, trace = tiny_synthetic
    cost = CostModel(g, HardwareConfig())
    cases = {
        "mixtral_offload": OffloadEngine(make_system("mixtral_offload", {}), g, 24, cost),
        "subclass": OffloadEngine(PickyTide(tau=2), g, 24, cost),
        "recording": OffloadEngine(make_system("tide", {"tau": 2}), g, 24, cost, trace=RoutingTrace(2, 256)),
    }
    for label, engine in cases.items():
        engine.prepare(None, 8)
        assert batch_refusal(engine, trace) is not None, label
        summary, mode = replay_trace(engine, trace)
        assert mode == "engine" and summary["forwards"] == len(trace), label
    unprepared = OffloadEngine(make_system("tide", {"tau": 2}), g, 24, cost)
    with pytest.raises(RuntimeError, match="prepare"):  # the engine's own error, not the fast path's
        replay_trace(unprepared, trace)


# ---- the packed bitsets (the tide kernels' twins: tests/kernels/test_tide_kernels.py) ---------
def test_popcount_without_numpy_bitwise_count(monkeypatch):
    words = pack(np.random.default_rng(3).random((5, 3, 200)) < 0.4)
    expected = popcount(words)
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert np.array_equal(popcount(words), expected)
    assert np.array_equal(expected, unpack(words, 200).sum(-1))


def test_summary_differences_catches_what_the_tests_rely_on(tiny_synthetic):
    g, trace = tiny_synthetic
    engine = OffloadEngine(make_system("tide", {"tau": 2}), g, 24, CostModel(g, HardwareConfig()))
    engine.prepare(None, 8)
    summary = engine.replay(trace)
    assert summary_differences(summary, dict(summary)) == []
    tweaks = {
        "missed_pairs": summary["missed_pairs"] + 1,
        "modeled_time_s": summary["modeled_time_s"] * (1 + 1e-8),
        "copies_sync": float(summary["copies_sync"]),  # an int must stay an int
    }
    for key, value in tweaks.items():
        assert summary_differences(summary, {**summary, key: value}) == [key]
    assert summary_differences(summary, {**summary, "time_copies_s": summary["time_copies_s"] * (1 + 1e-12)}) == []
    series = [dict(s) for s in summary["step_series"]]
    series[3]["modeled_latency_s"] *= 1.001
    assert summary_differences(summary, {**summary, "step_series": series}) == ["step_series[3].modeled_latency_s"]
    assert summary_differences(summary, {**summary, "step_series": series[:-1]})



def test_bench_prints_live_and_replay_figures_per_system_as_json(capsys):
    from harness.bench import main

    assert main(["steps=3", "forward=false", "format=json", "systems=gpu_only,tide,mixtral_offload", "repeats=4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["forwards"], out["moe_layers"]) == (3, 19) and set(out["systems"]) == {"gpu_only", "tide",
                                                                                        "mixtral_offload"}
    for name, row in out["systems"].items():
        assert row["layer_steps"] == 3 * 19
        assert row["live_us_per_layer_step"] > 0 and row["replay_layer_steps_per_s"] > 0
        # the parts are measured inside the live figure's own run
        assert 0 < row["plan_us_per_layer_step"] + row["engine_us_per_layer_step"] <= row["live_us_per_layer_step"]
        assert 0 < row["live_us_best"] <= row["live_us_per_layer_step"]  # the fastest of the 4 runs, and their median
        assert row["replay_mode"] == ("fast" if name == "tide" else "engine") and row["replay_exact"] is True


def test_bench_rejects_an_unknown_format():
    from harness.bench import main
    from harness.common.errors import HarnessError

    with pytest.raises(HarnessError, match="format=yaml is not one of table, json"):
        main(["steps=1", "forward=false", "format=yaml", "systems=gpu_only"])
