"""The routing generator and its fit (harness/routing/, docs/routing-regimes.md): structure
as the decode loops produce it, determinism, recovery of known knobs, and generate(fit(trace))
reproducing a proxy trace's statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from harness.common.errors import HarnessError
from harness.placement.trace import RoutingTrace
from harness.routing.fit import averaged_moments, fit, hint_quality, simulated_moments
from harness.routing.generate import Dims, _force, generate
from harness.routing.moments import shape_of, trace_moments
from harness.routing.params import RegimeFile, RoutingRegime, TraceShape
from harness.traces.routing_stats import routing_statistics

MINI = Path(__file__).resolve().parents[1] / "golden" / "mini" / "trace.npz"
SMALL = Dims(6, 32, 4, {"num_experts_per_tok": 4}, "small")
# |fitted - true| per knob on the AR traces below (docs/routing-regimes.md states these)
TOLERANCE = {"skew": 0.35, "shared": 0.1, "locality": 0.05, "decay": 0.1, "affinity": 0.15, "prefill_skew": 0.15,
             "prefill_overlap": 0.15}


def test_generated_trace_is_seeded_and_routes_top_k_distinct_experts() -> None:
    regime = RoutingRegime(locality=0.5, affinity=0.4)
    shape = TraceShape("ar", [5, 7], [9, 4], 4)
    a, b = generate(regime, shape, SMALL, seed=3), generate(regime, shape, SMALL, seed=3)
    assert np.array_equal(a.loads.numpy(), b.loads.numpy())
    assert not np.array_equal(a.loads.numpy(), generate(regime, shape, SMALL, seed=4).loads.numpy())
    kinds = [s.kind for s in a.steps]
    assert kinds == ["prefill"] + ["decode"] * 8 + ["prefill"] + ["decode"] * 3
    assert a.n_tokens[0] == 5 and a.n_context[:3] == [5, 6, 7] and a.steps[5].block == 1
    decode = a.loads.numpy()[[s.kind == "decode" for s in a.steps]]
    assert (decode.sum(-1) == 4).all() and decode.max() == 1  # k distinct experts per token and layer
    assert a.meta["routing"] == "generated" and a.meta["decode_steps"] == 11
    assert a.meta["generated_per_prompt"] == [9, 4]


def test_a_generated_trace_mirrors_a_recorded_block_diffusion_trace() -> None:
    recorded = RoutingTrace.load(MINI)
    generated = generate(RoutingRegime(), shape_of(recorded), Dims.of_trace(recorded))
    assert generated.steps == recorded.steps
    assert generated.n_tokens == recorded.n_tokens and generated.n_context == recorded.n_context
    assert (generated.loads.sum(-1) == recorded.loads.sum(-1)).all()  # the same routed pairs per layer


@pytest.mark.parametrize("true", [
    RoutingRegime(skew=1.2, shared=0.6, locality=0.4, decay=0.3, affinity=0.3, prefill_skew=0.6, prefill_overlap=0.3),
    RoutingRegime(skew=0.5, shared=0.2, locality=0.1, decay=0.0, affinity=0.6, prefill_skew=1.5, prefill_overlap=0.5),
])
def test_fit_recovers_the_knobs_of_a_synthetic_trace(true: RoutingRegime) -> None:
    trace = generate(true, TraceShape("ar", [32] * 12, [64] * 12, 32), SMALL, seed=1)
    fitted, record = fit(trace, popularity=("zipf",))  # the shape's choice: tests/unit/test_routing_popularity.py
    for knob, tol in TOLERANCE.items():
        assert abs(getattr(fitted, knob) - getattr(true, knob)) <= tol, (knob, fitted)
    # no forward of several tokens decoding in an AR trace, no denoising one
    assert record["unfitted"] == ["cohesion", "unmasking", "unmask_redraw", "solo_locality"]


def test_averaged_moments_are_the_mean_over_consecutive_seeds() -> None:
    """fit's average=N: the statistics of N generated traces at seeds seed..seed+N-1, meaned."""
    regime, shape = RoutingRegime(locality=0.5, affinity=0.4), TraceShape("ar", [8] * 4, [16] * 4, 8)
    each = [simulated_moments(regime, shape, SMALL, s) for s in (3, 4)]
    got = averaged_moments(regime, shape, SMALL, range(3, 5))
    assert got["locality"] == pytest.approx((each[0]["locality"] + each[1]["locality"]) / 2)
    assert each[0]["locality"] != each[1]["locality"]  # two seeds: two different traces
    one = averaged_moments(regime, shape, SMALL, range(3, 4))
    assert all(one[k] == v or (np.isnan(one[k]) and np.isnan(v)) for k, v in each[0].items())


def test_generate_of_fit_reproduces_a_proxy_traces_statistics(tmp_path: Path) -> None:
    recorded = RoutingTrace.load(MINI)
    fitted, _ = fit(recorded)
    path = RegimeFile(fitted, shape_of(recorded), name="mini").save(tmp_path / "mini.yaml")
    loaded = RegimeFile.load(path)
    assert loaded.regime == fitted
    generated = generate(loaded.regime, loaded.shape, Dims.of_trace(recorded), seed=7)
    want, got = routing_statistics(recorded, 64), routing_statistics(generated, 64)
    for key, tol in {"top_b_share": 0.03, "load_entropy": 0.01, "top_b_share_step": 0.12,
                     "distinct_experts_per_layer_step": 8.0, "popularity_cv": 0.2}.items():
        assert abs(got[key] - want[key]) <= tol, (key, got[key], want[key])
    assert abs(got["cosine_by_k"][0] - want["cosine_by_k"][0]) <= 0.15  # measured 0.142 (docs/routing-regimes.md)
    assert trace_moments(generated)["locality"] == pytest.approx(trace_moments(recorded)["locality"], abs=0.05)


def test_bad_knobs_and_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"locality=1\.5 must be a number in"):
        RoutingRegime(locality=1.5)
    with pytest.raises(HarnessError, match="unknown routing knob 'skw'"):
        RoutingRegime.from_dict({"skw": 1.0})
    (tmp_path / "r.yaml").write_text("[1, 2]")
    with pytest.raises(HarnessError, match="holds no 'regime' mapping"):
        RegimeFile.load(tmp_path / "r.yaml")
    with pytest.raises(HarnessError, match=r"shape\.mode='x'"):
        TraceShape("x")


def test_each_hint_channel_has_its_own_quality_and_fit_reads_both_back() -> None:
    shape = TraceShape("ar", [16] * 4, [24] * 4, 8)
    one = generate(RoutingRegime(hint_quality=0.7), shape, SMALL, seed=2)
    both = generate(RoutingRegime(hint_quality=0.7, residual_hint_quality=0.2), shape, SMALL, seed=2)
    assert np.array_equal(one.loads.numpy(), both.loads.numpy())  # the knob changes hints, never routing
    s = 5
    assert torch.equal(one.step_hints(s, "residual"), one.step_hints(s, "next_gate"))  # unset: one stand-in
    assert torch.equal(both.step_hints(s, "next_gate"), one.step_hints(s, "next_gate"))
    assert not torch.equal(both.step_hints(s, "residual"), both.step_hints(s, "next_gate"))
    # fit regresses on the request's mean load, the generator mixed in its expectation: close, not equal
    assert hint_quality(both) == pytest.approx(0.7, abs=0.02)
    assert hint_quality(both, "residual") == pytest.approx(0.2, abs=0.02)
    assert hint_quality(one, "residual") is None  # a stand-in is no recorded channel
    assert "residual_hint_quality" not in RoutingRegime(hint_quality=0.7).as_dict()  # old files: same knobs


def forced_one_by_one(scores: np.ndarray, cand: np.ndarray, keep: np.ndarray, bonus: float) -> np.ndarray:
    """The plain definition of the generator's forced slots: each kept candidate's score gets
    the bonus once, however often it is listed."""
    out = scores.copy()
    for row in np.ndindex(*keep.shape[:-1]):
        for expert in {int(c) for c, k in zip(cand[row], keep[row], strict=True) if k}:
            out[(*row, expert)] = scores[(*row, expert)] + np.float32(bonus)
    return out


@pytest.mark.parametrize("shape", [(5, 16), (3, 4, 16)])
def test_forced_slots_equal_their_plain_definition_bit_for_bit(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(shape).astype(np.float32)
    cand = rng.integers(0, 4, size=(*shape[:-1], 6))  # 6 slots over 4 experts: repeats
    keep = rng.random((*shape[:-1], 6)) < 0.5
    before = scores.copy()
    forced = _force(scores, cand, keep, 1e4)
    assert forced.dtype == np.float32 and keep.any() and not keep.all()
    np.testing.assert_array_equal(forced, forced_one_by_one(scores, cand, keep, 1e4))
    np.testing.assert_array_equal(scores, before)  # a new array: the caller's scores stay
