"""DALI's measures on hand-made traces whose values are worked out by hand in the comments:
the two predictors' precision and recall (harness/traces/dali_measures.py), the LRU, LFU
and workload cache replays, and the ledger's busy shares and expert hit rate per phase
(harness/accounting/phases.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.accounting.ledger import LayerOutcomes, Ledger
from harness.model.config import LLaDA2Config
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.traces.dali_measures import (
    REPLACEMENTS,
    cache_measures,
    measures_of_trace,
    prediction_measures,
    replay_cache,
)

KINDS = np.array(["prefill", "decode"], dtype=object)


def _loads(*rows: list[list[int]]) -> np.ndarray:
    return np.array(rows, np.int64)


# ---- predictors --------------------------------------------------------------------------
# 2 forwards x 3 layers x 4 experts, k = 2; rows l = 0, 1 predict layers 1, 2
LOADS = _loads(
    [[1, 1, 0, 0], [3, 1, 1, 0], [1, 0, 0, 1]],  # f0 (prefill): layer 1 uses {0,1,2}, layer 2 {0,3}
    [[0, 1, 0, 1], [0, 0, 1, 1], [1, 1, 0, 0]],  # f1 (decode): layer 1 uses {2,3}, layer 2 {0,1}
)
HINTS = np.array([
    [[0.1, 0.9, 0.8, 0.0], [0.5, 0.4, 0.0, 0.1], [0, 0, 0, 0]],  # f0 names {1,2} (2 used), {0,1} (1 used)
    [[0.0, 0.0, 0.6, 0.6], [0.0, 0.0, 0.2, 0.3], [0, 0, 0, 0]],  # f1 names {2,3} (2 used, tie: id order), {2,3} (0)
], np.float32)


def test_residual_predictor_precision_and_recall_by_hand() -> None:
    got = prediction_measures(KINDS, LOADS, HINTS, top_k=2)
    # hits 2 + 1 + 2 + 0 = 5 of 8 named; used 3 + 2 + 2 + 2 = 9
    assert got["prefetch_precision_residual"] == 5 / 8
    assert got["prefetch_recall_residual"] == 5 / 9
    assert got["prefetch_precision_residual_prefill"] == 3 / 4 and got["prefetch_recall_residual_prefill"] == 3 / 5
    assert got["prefetch_precision_residual_decode"] == 2 / 4 and got["prefetch_recall_residual_decode"] == 2 / 4


def test_token_count_predictor_uses_the_earlier_forwards_only() -> None:
    got = prediction_measures(KINDS, LOADS, None, top_k=2)
    # f0: no history, ids {0,1}: layer 1 hits 2 ({0,1} of {0,1,2}), layer 2 hits 1 ({0} of {0,3});
    # f1: layer 1's history [3,1,1,0] names {0,1}: 0 of {2,3}; layer 2's [1,0,0,1] names {0,3}: 1 of {0,1}
    assert got["prefetch_precision_token_count"] == 4 / 8 and got["prefetch_recall_token_count"] == 4 / 9
    assert got["prefetch_precision_token_count_decode"] == 1 / 4
    assert not any("residual" in k for k in got)  # no hints, no residual figures


def test_precision_equals_recall_when_a_forward_has_one_token() -> None:
    """A decode forward routes one token to top_k experts: k named, k used."""
    rng = np.random.default_rng(0)
    loads = np.zeros((5, 4, 16), np.int64)
    for f in range(5):
        for layer in range(4):
            loads[f, layer, rng.choice(16, 3, replace=False)] = 1
    got = prediction_measures(np.array(["decode"] * 5, dtype=object), loads, rng.random((5, 4, 16)), top_k=3)
    assert got["prefetch_precision_residual"] == got["prefetch_recall_residual"]
    assert got["prefetch_precision_token_count"] == got["prefetch_recall_token_count"]


# ---- cache replays -----------------------------------------------------------------------
# one layer, 4 experts, B = 2 (the cache starts with {0, 1}); one token per forward
SEQUENCE = _loads([[1, 0, 0, 0]], [[1, 0, 0, 0]], [[0, 0, 1, 0]], [[0, 0, 0, 1]], [[1, 0, 0, 0]])


def test_lru_and_lfu_by_hand() -> None:
    # f0, f1: 0 hits. f2: 2 misses; LRU evicts 1 (never used), LFU too (0 uses). f3: 3 misses;
    # LRU evicts 0 (used at f1, before 2 at f2), LFU evicts 2 (1 use against 0's 2). f4: 0 hits
    # under LFU only.
    assert replay_cache(SEQUENCE, 2, "lru").tolist() == [1, 1, 0, 0, 0]
    assert replay_cache(SEQUENCE, 2, "lfu").tolist() == [1, 1, 0, 0, 1]


def test_workload_replacement_by_hand() -> None:
    # horizon 8, scores = tokens over the window: f2 [2,0,1,0]: 2 replaces 1 (0 < 1); f3
    # [2,0,1,1]: 3 (1) does not beat the lowest victim 2 (1): refused; f4: 0 hits
    assert replay_cache(SEQUENCE, 2, "workload").tolist() == [1, 1, 0, 0, 1]
    # horizon 1 (this forward only): f3 [0,0,0,1]: 3 replaces 0 (score 0, the lower id); f4 misses
    assert replay_cache(SEQUENCE, 2, "workload", horizon=1).tolist() == [1, 1, 0, 0, 0]


def test_workload_refuses_a_light_newcomer() -> None:
    # B = 1 holding 0: f0 hits 0 (score 4); f1 routes 1 (score 1 < 0's 4): not admitted, so f2 hits 0.
    # LRU admits 1 at f1 and misses 0 at f2.
    loads = _loads([[4, 0]], [[0, 1]], [[1, 0]])
    assert replay_cache(loads, 1, "workload").tolist() == [1, 0, 1]
    assert replay_cache(loads, 1, "lru").tolist() == [1, 0, 0]


def test_misses_beyond_the_cache_are_not_cached() -> None:
    # B = 2, a prefill routes 3 experts not held: the two heaviest (3, then 2 before 1) are cached
    loads = _loads([[0, 0, 1, 1, 0]], [[0, 0, 0, 0, 0]], [[0, 0, 1, 0, 1]])
    loads[0, 0] = [0, 0, 1, 2, 5]
    for rule in ("lru", "lfu", "workload"):
        assert replay_cache(loads, 2, rule).tolist() == [0, 0, 1], rule


def replay_reference(loads: np.ndarray, capacity: int, rule: str, horizon: int = 8) -> np.ndarray:
    """Test-only reference: the module docstring's rule, layer by layer, one miss at a time."""
    n_forwards, n_layers, n_experts = loads.shape
    hits = np.zeros(n_forwards, np.int64)
    ids = np.arange(n_experts)
    for layer in range(n_layers):
        cached = ids < min(capacity, n_experts)
        last, uses, score = np.full(n_experts, -1), np.zeros(n_experts, np.int64), np.zeros(n_experts)
        for f in range(n_forwards):
            load = loads[f, layer]
            demand = load > 0
            hits[f] += np.count_nonzero(demand & cached)
            score = loads[max(0, f - horizon + 1): f + 1, layer].sum(0)
            if rule == "workload":
                priority, victim_key = -score, score
            else:
                priority = -load
                victim_key = last * n_experts + ids if rule == "lru" else uses * n_experts + ids
            misses = sorted(np.flatnonzero(demand & ~cached).tolist(), key=lambda e: (priority[e], e))
            victims = sorted(np.flatnonzero(cached & ~demand).tolist(), key=lambda e: (victim_key[e], e))
            room = min(capacity, n_experts) - int(np.count_nonzero(cached))
            for e in misses:
                if room > 0:
                    room -= 1
                elif victims and (rule != "workload" or score[e] > score[victims[0]]):
                    cached[victims.pop(0)] = False
                else:
                    continue
                cached[e] = True
            last[demand] = f
            uses += demand
    return hits


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rule", ["lru", "lfu", "workload"])
def test_the_replay_of_every_layer_at_once_is_the_one_miss_at_a_time_rule(rule: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_experts = int(rng.integers(2, 12))
    loads = rng.integers(0, 5, (30, 4, n_experts)) * (rng.random((30, 4, n_experts)) < rng.uniform(0.1, 0.9))
    capacity = int(rng.integers(0, n_experts + 2))
    horizon = int(rng.choice([1, 3, 8, 40]))
    got = replay_cache(loads, capacity, rule, horizon)
    assert got.tolist() == replay_reference(loads, capacity, rule, horizon).tolist()


def test_cache_measures_per_phase() -> None:
    kinds = np.array(["prefill", "decode", "decode", "decode", "decode"], dtype=object)
    got = cache_measures(kinds, SEQUENCE, 2)
    assert got["cache_hit_rate_lfu"] == 3 / 5 and got["cache_hit_rate_lru"] == 2 / 5
    assert got["cache_hit_rate_lfu_prefill"] == 1.0 and got["cache_hit_rate_lfu_decode"] == 2 / 4


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown replacement rule"):
        replay_cache(SEQUENCE, 2, "fifo")


@pytest.mark.parametrize("channels", [("next_gate",), ("next_gate", "residual")])
def test_measures_of_a_trace_use_its_hints_and_kinds(channels: tuple[str, ...]) -> None:
    """Each hint channel the trace carries gets its figures; an older recording (next_gate
    only) gets no residual ones. The residual channel here is the next_gate one rolled by one expert."""
    trace = RoutingTrace(3, 4)
    for f, kind in enumerate(("prefill", "decode")):
        trace.add_step(StepInfo(0, 0, f, f, True, kind), 3, 3)
        for layer in range(3):
            hint = torch.from_numpy(HINTS[f, layer])
            trace.record(layer, torch.from_numpy(LOADS[f, layer]),
                         {c: hint if c == "next_gate" else hint.roll(1) for c in channels})
    got = measures_of_trace(trace, capacity=2, top_k=2)
    assert got["prefetch_recall_next_gate"] == 5 / 9 and got["prefetch_recall_token_count"] == 4 / 9
    if "residual" in channels:
        expected = prediction_measures(KINDS, LOADS, np.roll(HINTS, 1, axis=-1), 2)
        assert expected["prefetch_recall_residual"] == 3 / 9  # by hand: 1 + 0 + 1 + 1 hits
        assert got["prefetch_recall_residual"] == expected["prefetch_recall_residual"]
        assert got["prefetch_precision_residual"] == expected["prefetch_precision_residual"]
        assert got["prefetch_recall_residual"] != got["prefetch_recall_next_gate"]
    else:
        assert not any("residual" in k for k in got)
    assert set(got) >= {"cache_hit_rate_workload", "cache_hit_rate_lru_decode", "cache_hit_rate_lfu_prefill"}


# ---- the ledger's phases -----------------------------------------------------------------
TINY = LLaDA2Config(hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3)


def _ledger_run(chunks: list[slice]) -> Ledger:
    """2 forwards (prefill, decode) x 2 layers x 4 experts; charged in the given chunks."""
    cost = CostModel(TINY, HardwareConfig())
    loads = _loads([[2, 1, 0, 0], [0, 3, 1, 0]], [[1, 0, 0, 0], [0, 0, 0, 1]])
    on_gpu = np.array([[[1, 0, 0, 0], [0, 1, 1, 0]], [[0, 0, 0, 0], [0, 0, 0, 1]]], bool)
    missed = np.array([[[0, 1, 0, 0], [0, 0, 1, 0]], [[1, 0, 0, 0], [0, 0, 0, 1]]], bool)
    zeros = np.zeros((2, 2), np.int64)
    steps = [StepInfo(0, 0, 0, 0, True, "prefill"), StepInfo(0, 0, 0, 1, True, "decode")]
    ledger = Ledger(cost, 2, 4, overlap=True)
    ledger.track_phases()
    for rows in chunks:
        ledger.charge(steps[rows], [(3, 3), (1, 4)][rows], LayerOutcomes(
            loads[rows], on_gpu[rows], missed[rows], zeros[rows], zeros[rows], zeros[rows]))
    return ledger


def test_busy_shares_and_hit_rate_per_phase() -> None:
    ledger = _ledger_run([slice(0, 2)])
    got = ledger.measures()
    prefill, decode = ledger.phases.by_kind["prefill"], ledger.phases.by_kind["decode"]
    cost = ledger.cost
    # prefill: GPU experts 0 (2 tokens) and 1 (3), 2 (1) -> gpu_s; CPU expert 1 (1 token)
    assert prefill.gpu_experts_s == pytest.approx(cost.gpu_expert_time(2) + cost.gpu_expert_time(3)
                                                  + cost.gpu_expert_time(1))
    assert prefill.cpu_experts_busy_s == pytest.approx(cost.cpu_expert_time(1))
    assert decode.cpu_experts_busy_s == pytest.approx(cost.cpu_expert_time(1))
    # routed (layer, expert) pairs 2 + 2 and 1 + 1; missed 2 and 2
    assert (prefill.routed_experts, prefill.missed_experts) == (4, 2)
    assert (decode.routed_experts, decode.missed_experts) == (2, 2)
    assert got["expert_hit_rate"] == 2 / 6 and got["expert_hit_rate_prefill"] == 0.5
    assert got["expert_hit_rate_decode"] == 0.0
    series = ledger.step_series()
    assert prefill.modeled_s == series[0]["modeled_latency_s"] and decode.modeled_s == series[1]["modeled_latency_s"]
    c = ledger.counters_now()
    modeled = c.time_gpu_experts_s + c.time_cpu_experts_s + c.time_copies_s + c.time_non_expert_s
    assert got["cpu_busy_share"] == c.busy_cpu_experts_s / modeled
    assert got["gpu_busy_share"] == (c.time_gpu_experts_s + c.time_non_expert_s) / modeled
    assert got["cpu_expert_share"] == c.busy_cpu_experts_s / (c.busy_cpu_experts_s + c.time_gpu_experts_s)
    assert got["cpu_side_share"] == c.busy_cpu_experts_s / (c.busy_cpu_experts_s + c.time_gpu_experts_s
                                                            + c.busy_copies_s)
    assert got["cpu_expert_share_decode"] == pytest.approx(
        cost.cpu_expert_time(1) / (cost.cpu_expert_time(1) + cost.gpu_expert_time(1)))
    assert 0 < got["gpu_busy_share_prefill"] <= 1 and 0 < got["cpu_busy_share_prefill"] <= 1


def test_phase_tallies_do_not_depend_on_how_forwards_are_charged() -> None:
    together, apart = _ledger_run([slice(0, 2)]), _ledger_run([slice(0, 1), slice(1, 2)])
    assert together.phases.by_kind == apart.phases.by_kind
    assert together.measures() == apart.measures()


def test_a_ledger_without_phases_reports_no_measures() -> None:
    ledger = Ledger(CostModel(TINY, HardwareConfig()), 2, 4, overlap=True)
    assert ledger.measures() == {} and ledger.phases is None


# ---- the time-correlation score against LRU and LFU ---------------------------------------
def phased_trace(seed: int, n_forwards: int = 400, phase: int = 25) -> np.ndarray:
    """Temporal locality: one layer of 16 experts; every `phase` forwards a new hot set of 4;
    each forward routes 3 tokens to two of the hot set and one token to a random expert
    (noise that is rarely used again soon)."""
    rng = np.random.default_rng(seed)
    loads = np.zeros((n_forwards, 1, 16), np.int64)
    for f in range(n_forwards):
        if f % phase == 0:
            hot = rng.choice(16, 4, replace=False)
        for e in rng.choice(hot, 2, replace=False):
            loads[f, 0, e] += 3
        loads[f, 0, rng.integers(16)] += 1
    return loads


def stationary_trace(seed: int, n_forwards: int = 2000) -> np.ndarray:
    """No temporal locality: every forward draws 3 of the 16 experts uniformly and
    independently of every other forward, one token each (no policy can know more than
    B/E of the next forward's experts)."""
    rng = np.random.default_rng(seed)
    loads = np.zeros((n_forwards, 1, 16), np.int64)
    for f in range(n_forwards):
        loads[f, 0, rng.choice(16, 3, replace=False)] = 1
    return loads


def hit_rates(loads: np.ndarray, capacity: int = 4) -> dict[str, float]:
    demanded = int((loads > 0).sum())
    return {rule: int(replay_cache(loads, capacity, rule).sum()) / demanded for rule in REPLACEMENTS}


@pytest.mark.parametrize("seed", range(3))
def test_with_temporal_locality_the_time_correlation_score_beats_lru_and_lfu(seed: int) -> None:
    rates = hit_rates(phased_trace(seed))
    assert rates["workload"] > rates["lru"] and rates["workload"] > rates["lfu"], rates


@pytest.mark.parametrize("seed", range(3))
def test_without_temporal_locality_the_time_correlation_score_does_not_beat_them(seed: int) -> None:
    rates = hit_rates(stationary_trace(seed))
    # each rule sits at B / E = 0.25 up to sampling noise (2000 forwards x 3 demands: sd ~0.006)
    assert rates["workload"] <= max(rates["lru"], rates["lfu"]) + 0.02, rates
    assert all(abs(r - 0.25) < 0.03 for r in rates.values()), rates
