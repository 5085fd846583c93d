"""Routing statistics (harness/traces/routing_stats.py) on synthetic traces with known values."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from harness.analyze import main as analyze_main
from harness.common.errors import HarnessError
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.report.notes import routing_markdown
from harness.traces.routing_stats import (
    main,
    routing_metrics,
    routing_statistics,
    statistics_with_uniform,
    uniform_like,
)

E, L, K = 256, 2, 8


def trace_of(step_loads: list[tuple[int, torch.Tensor]], steps_per_block: int = 4, meta: dict | None = None
             ) -> RoutingTrace:
    """Denoising forwards; step_loads: (prompt, load [E]) recorded on every layer."""
    trace = RoutingTrace(L, E, geometry={"num_experts": E, "num_experts_per_tok": K}, meta=meta or {})
    for i, (prompt, load) in enumerate(step_loads):
        block, step = divmod(i, steps_per_block)
        trace.add_step(StepInfo(prompt, block, step, i, block == 0, "denoise"), n_tokens=int(load.sum()) // K)
        for layer in range(L):
            trace.record(layer, load)
    return trace


def experts(ids: range, count: int = 1) -> torch.Tensor:
    load = torch.zeros(E, dtype=torch.int32)
    load[list(ids)] = count
    return load


def test_one_hot_routing():
    """Every token on experts 0..7: the most concentrated routing possible."""
    trace = trace_of([(p, experts(range(8), 4)) for p in (0, 1) for _ in range(4)],
                     meta={"generated_tokens": 64, "denoise_steps": 16})
    s = routing_statistics(trace, b=8, max_k=3)
    assert s["distinct_experts_per_layer_step"] == 8
    assert s["top_b_share"] == 1.0
    assert s["unused_experts_per_layer"] == E - 8
    assert s["popularity_cv"] == pytest.approx(math.sqrt(E / 8 - 1))
    assert s["cross_prompt_popularity_corr"] == pytest.approx(1.0)
    assert s["cosine_by_k"] == pytest.approx([1.0, 1.0, 1.0])
    assert s["tokens_per_denoise_step"] == 4.0
    assert s["B"] == 8


def test_perfectly_even_routing():
    """Every expert the same count every step: no expert is special, nothing to correlate."""
    trace = trace_of([(p, experts(range(E), 2)) for p in (0, 1) for _ in range(4)])
    s = routing_statistics(trace, b=64, max_k=2)
    assert s["distinct_experts_per_layer_step"] == E
    assert s["top_b_share"] == pytest.approx(64 / E)
    assert s["unused_experts_per_layer"] == 0
    assert s["popularity_cv"] == 0
    assert s["cross_prompt_popularity_corr"] is None  # constant popularity: correlation undefined
    assert s["tokens_per_denoise_step"] is None  # the trace does not say how many tokens were generated


def test_half_overlap():
    """Steps alternate between experts 0..15 and 8..23 (half shared): cosine 0.5 one step
    apart, 1.0 two steps apart; the two prompts' popularity vectors are identical."""
    a, b = experts(range(0, 16)), experts(range(8, 24))
    trace = trace_of([(p, x) for p in (0, 1) for x in (a, b, a, b)])
    s = routing_statistics(trace, b=16, max_k=2)
    assert s["cosine_by_k"] == pytest.approx([0.5, 1.0])
    assert s["distinct_experts_per_layer_step"] == 16
    assert s["unused_experts_per_layer"] == E - 24
    # popularity over the run: experts 8..15 count 8, 0..7 and 16..23 count 4
    assert s["top_b_share"] == pytest.approx((8 * 8 + 8 * 4) / (8 * 8 + 16 * 4))
    assert s["cross_prompt_popularity_corr"] == pytest.approx(1.0)


def test_prompts_on_disjoint_experts_correlate_negatively():
    trace = trace_of([(0, experts(range(0, 8)))] * 4 + [(1, experts(range(8, 16)))] * 4)
    pop = torch.zeros(E)
    pop[:8] = 1  # Pearson of two disjoint 8-hot vectors over 256 entries
    other = torch.roll(pop, 8)
    expected = float(torch.corrcoef(torch.stack([pop, other]))[0, 1])
    assert routing_statistics(trace, b=8)["cross_prompt_popularity_corr"] == pytest.approx(expected)


def test_uniform_like_keeps_token_counts_and_picks_distinct_experts():
    trace = trace_of([(0, experts(range(16), 2))] * 3)  # 32 pairs = 4 tokens of top-8 per step
    uniform = uniform_like(trace, seed=1)
    assert uniform.loads.shape == trace.loads.shape
    assert torch.equal(uniform.loads.sum(-1), trace.loads.sum(-1))
    assert int(uniform.loads.max()) <= 4  # 4 tokens, each expert at most once per token
    stats = statistics_with_uniform(trace, b=8)
    assert stats["uniform"]["distinct_experts_per_layer_step"] > stats["distinct_experts_per_layer_step"]


def test_metrics_are_flat_and_numeric():
    trace = trace_of([(0, experts(range(8)))] * 3, meta={"generated_tokens": 3, "denoise_steps": 3})
    metrics = routing_metrics(statistics_with_uniform(trace, b=8, max_k=2))
    assert metrics["routing_top_b_share"] == 1.0
    assert metrics["routing_cosine_k1"] == pytest.approx(1.0)
    assert "routing_uniform_top_b_share" in metrics
    assert "routing_uniform_tokens_per_denoise_step" not in metrics  # not a routing property
    assert all(isinstance(v, float) for v in metrics.values())


def test_analyze_json_prints_one_object(tmp_path, capsys):
    trace = trace_of([(0, experts(range(8)))] * 4, meta={"model": "synthetic", "weights": "random-proxy"})
    path = trace.save(tmp_path / "trace.npz")
    assert analyze_main([f"trace={path}", "B=8", "max_k=2", "format=json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("distinct_experts_per_layer_step", "top_b_share", "unused_experts_per_layer", "popularity_cv",
                "cross_prompt_popularity_corr", "cosine_by_k", "tokens_per_denoise_step", "uniform"):
        assert key in out
    assert out["top_b_share"] == 1.0 and out["weights"] == "random-proxy"
    assert not (tmp_path / "stability.csv").exists()  # json writes nothing


def test_report_prints_statistics_beside_uniform():
    stats = {"distinct_experts_per_layer_step": 44.0, "top_b_share": 0.99, "unused_experts_per_layer": 45.0,
             "popularity_cv": 2.7, "cross_prompt_popularity_corr": 0.8, "tokens_per_denoise_step": 1.1,
             "cosine_by_k": [0.9, 0.8], "B": 64,
             "uniform": {"distinct_experts_per_layer_step": 162.0, "top_b_share": 0.25}}
    record = {"model": "mini", "system": "tide", "budget": "10GB", "experts": 64, "gen_length": 32,
              "block_length": 32, "routing": stats, "order": 0, "source": "run"}
    text = routing_markdown([record, {**record, "system": "fiddler", "routing": None}])
    # one line for the row (its cell, gen-B-budget, and model and block as the main table names them)
    assert "| 32-64-10GB | mini | 32 | 64 | 44 (162) | 0.99 (0.25) | 45 | 2.7 |" in re.sub(" +", " ", text)
    assert routing_markdown([{**record, "routing": None}]) == ""


def small_trace(rows: list[list[int]], kinds: list[str] | None = None) -> RoutingTrace:
    """One layer of 4 experts, one forward per row."""
    trace = RoutingTrace(1, 4)
    for i, load in enumerate(rows):
        trace.add_step(StepInfo(0, 0, i, i, True, (kinds or ["denoise"] * len(rows))[i]), 4, 4)
        trace.record(0, torch.tensor(load))
    return trace


def test_per_step_share_and_entropy_on_balanced_and_rotating_routing():
    balanced = routing_statistics(small_trace([[1, 1, 1, 1], [2, 2, 2, 2]]), b=2, max_k=1)
    assert balanced["load_entropy"] == pytest.approx(1.0)
    assert balanced["top_b_share"] == pytest.approx(0.5) and balanced["top_b_share_step"] == pytest.approx(0.5)
    # each step uses one expert, but a different one: concentrated per step, balanced over the run
    rotating = routing_statistics(small_trace([[4, 0, 0, 0], [0, 4, 0, 0]]), b=1, max_k=1)
    assert rotating["top_b_share_step"] == 1.0 and rotating["top_b_share"] == pytest.approx(0.5)
    assert rotating["load_entropy"] == pytest.approx(math.log(2) / math.log(4))
    assert rotating["distinct_experts_per_layer_step"] == 1 and rotating["forwards"] == 2


def test_per_step_statistics_count_denoising_forwards_only():
    """A commit forward's load counts in the run's popularity, not in the per-step figures."""
    stats = routing_statistics(small_trace([[9, 0, 0, 0], [1, 1, 1, 1]], ["commit", "denoise"]), b=1, max_k=1)
    assert stats["forwards"] == 1 and stats["top_b_share_step"] == pytest.approx(0.25)
    assert stats["distinct_experts_per_layer_step"] == 4 and stats["top_b_share"] == pytest.approx(10 / 13)
    with pytest.raises(HarnessError, match="no denoising steps"):
        routing_statistics(small_trace([[1, 0, 0, 0]], ["prefill"]), b=1)


def test_cli_prints_the_statistics_and_bad_input_is_one_line(tmp_path, capsys):
    path = small_trace([[1, 1, 1, 1]]).save(tmp_path / "t.npz")
    assert main([str(path), "2"]) == 0
    assert "top_b_share=0.5 (uniform" in capsys.readouterr().out
    with pytest.raises(HarnessError, match="between 1 and the trace's 4 experts"):
        main([str(path), "5"])
    with pytest.raises(HarnessError):
        main([str(tmp_path / "missing.npz")])
