"""Token-level routing statistics (harness/traces/locality.py, in routing_stats) on hand-made
decodes with known answers, their uniform-routing values, and a trace's requests held out
for calibration (harness/traces/holdout.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from harness.common.errors import HarnessError
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.traces.holdout import hold_out
from harness.traces.importing import Imported, Request, build_trace, model_geometry
from harness.traces.routing_stats import routing_statistics, uniform_like
from tests.routing_files import random_routing, write_config


def decode_trace(prompts: list[list[set[int]]], n_experts: int = 8, top_k: int = 2, prefill: bool = True
                 ) -> RoutingTrace:
    """One MoE layer; per prompt a prefill (its tokens: the first set) and one decode forward per set."""
    trace = RoutingTrace(1, n_experts, geometry={"num_experts": n_experts, "num_experts_per_tok": top_k})
    for p, sets in enumerate(prompts):
        if prefill:
            trace.add_step(StepInfo(p, 0, 0, len(trace), True, "prefill"), 1, 1)
            trace.record(0, _load(sets[0], n_experts))
        for d, experts in enumerate(sets):
            trace.add_step(StepInfo(p, d // 32, d % 32, len(trace), d < 32, "decode"), 1, d + 2)
            trace.record(0, _load(experts, n_experts))
    return trace


def _load(experts: set[int], n: int) -> torch.Tensor:
    load = torch.zeros(n, dtype=torch.int32)
    load[sorted(experts)] = 1
    return load


def test_locality_and_lru_on_a_hand_counted_decode() -> None:
    """tokens {0,1} {1,2} {1,2} {5,6}: the previous token shared 1/2, 2/2, 0/2 -> 3/6; an LRU
    cache of 8 // 4 = 2 experts hits 0, 1, 2, 0 of 8 routed -> 3/8."""
    s = routing_statistics(decode_trace([[{0, 1}, {1, 2}, {1, 2}, {5, 6}]]), b=2)
    assert s["temporal_locality"] == 0.5 and s["lru_hit_rate"] == 3 / 8 and s["lru_B"] == 2


def test_each_prompt_starts_cold_and_pairs_never_cross_prompts() -> None:
    s = routing_statistics(decode_trace([[{0, 1}, {0, 1}], [{0, 1}, {0, 1}]]), b=2)
    assert s["temporal_locality"] == 1.0  # within each prompt the same experts; never compared across
    assert s["lru_hit_rate"] == 4 / 8  # each prompt's first token misses both


def test_prefill_against_decode() -> None:
    same = decode_trace([[{0, 1}, {0, 1}, {0, 1}], [{2, 3}, {2, 3}, {2, 3}]])
    s = routing_statistics(same, b=2)
    assert s["prefill_decode_popularity_corr"] == pytest.approx(1.0)
    assert s["load_entropy_prefill"] == pytest.approx(s["load_entropy_decode"]) == pytest.approx(2 / 3)


def test_no_single_token_forwards_no_token_statistics() -> None:
    trace = RoutingTrace(1, 8, geometry={"num_experts": 8, "num_experts_per_tok": 2})
    for step in range(3):
        trace.add_step(StepInfo(0, 0, step, step, True, "denoise"), 4, 4)
        trace.record(0, _load({0, 1, 2, 3}, 8) * 2)
    s = routing_statistics(trace, b=2)
    assert s["temporal_locality"] is None and s["lru_hit_rate"] is None
    assert s["load_entropy_prefill"] is None and s["prefill_decode_popularity_corr"] is None


def test_uniform_routing_gives_k_over_e_and_capacity_over_e() -> None:
    rng = np.random.default_rng(0)
    sets = [set(rng.choice(64, 2, replace=False).tolist()) for _ in range(1500)]
    s = routing_statistics(uniform_like(decode_trace([sets], n_experts=64)), b=16)
    assert s["temporal_locality"] == pytest.approx(2 / 64, abs=0.01)
    assert s["lru_hit_rate"] == pytest.approx(16 / 64, abs=0.03)


def test_held_out_requests_are_whole_traces_of_their_own(tmp_path: Path) -> None:
    geometry, model = model_geometry("hf", str(write_config(tmp_path)))
    routings = random_routing(3, seed=9)
    requests = [Request(f"r{i}", r.prompt, r.generated, r.tokens, None, float(i)) for i, r in enumerate(routings)]
    trace = build_trace(Imported(requests, {"path": "x"}), geometry, model)
    kept, held = hold_out(trace, 1, tmp_path / "t.npz")
    assert sorted({s.prompt for s in kept.steps}) == [0, 1] and {s.prompt for s in held.steps} == {0}
    assert [s.global_step for s in held.steps] == list(range(len(held)))
    assert kept.loads.equal(trace.loads[: len(kept)]) and held.loads.equal(trace.loads[len(kept):])
    tokens = [r.tokens for r in routings]
    assert (kept.meta["prompts"], kept.meta["generated_per_prompt"], kept.meta["generated_tokens"]) == \
        (2, tokens[:2], sum(tokens[:2]))
    assert (held.meta["requests"], held.meta["decode_steps"], held.meta["purpose"]) == (["r2"], tokens[2] - 1,
                                                                                         "calibration")
    assert held.meta["requested_tokens"] == tokens[2]
    with pytest.raises(HarnessError, match=r"calibration.from_workload=3 holds out 3 requests .* has 3, and the "
                                           r"replay needs at least one"):
        hold_out(trace, 3, tmp_path / "t.npz")
