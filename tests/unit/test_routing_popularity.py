"""The popularity's shape (`lognormal`) and the prefill's own routing (`prefill_overlap`) of
the routing generator (docs/routing-regimes.md): unset, each generates the routing of before
bit for bit; set, each moves the statistic it is fitted to; `fit` picks the shape a trace has."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.routing.fit import choose_shape, fit
from harness.routing.generate import Dims, generate, lognormal_ranks, zipf
from harness.routing.moments import trace_head_share, trace_moments
from harness.routing.params import RoutingRegime, TraceShape

SMALL = Dims(6, 32, 4, {"num_experts_per_tok": 4}, "small")
SHAPE = TraceShape("ar", [24] * 8, [48] * 8, 16)


def entropy(p: np.ndarray) -> float:
    return float(-(p * np.log(p)).sum() / math.log(len(p)))


def test_unset_knobs_generate_the_routing_of_before() -> None:
    base = RoutingRegime(skew=1.1, shared=0.4, locality=0.3, affinity=0.2, prefill_skew=0.7)
    before = generate(base, SHAPE, SMALL, seed=5).loads.numpy()
    assert np.array_equal(before, generate(RoutingRegime(**{**base.as_dict(), "lognormal": 0.0}), SHAPE, SMALL,
                                           seed=5).loads.numpy())
    # overlap 1: the decoding rankings, as unset (the prefill's own rankings have a generator of their own)
    assert np.array_equal(before, generate(RoutingRegime(**{**base.as_dict(), "prefill_overlap": 1.0}), SHAPE,
                                           SMALL, seed=5).loads.numpy())
    assert "lognormal" not in base.as_dict() and "prefill_overlap" not in base.as_dict()


def test_a_lognormal_head_is_lighter_than_a_zipf_one_at_equal_entropy() -> None:
    z = zipf(256, 0.857)
    sigmas = np.linspace(0.5, 2.0, 301)
    sigma = sigmas[np.argmin([abs(entropy(lognormal_ranks(256, s)) - entropy(z)) for s in sigmas])]
    ln = lognormal_ranks(256, sigma)
    assert entropy(ln) == pytest.approx(entropy(z), abs=0.002)
    assert np.all(np.diff(ln) <= 0) and ln.sum() == pytest.approx(1.0)
    assert ln[:8].sum() < z[:8].sum() - 0.03  # a lighter head...
    assert ln[128:].sum() < z[128:].sum() - 0.03  # ...and a lighter tail: more mass in the middle


def test_prefill_overlap_moves_its_statistic_and_nothing_of_the_decode() -> None:
    got = {}
    for overlap in (0.0, 0.5, 1.0):
        trace = generate(RoutingRegime(skew=1.2, shared=0.3, prefill_skew=1.2, prefill_overlap=overlap), SHAPE, SMALL,
                         seed=2)
        got[overlap] = trace_moments(trace)
    assert got[0.0]["prefill_overlap"] < got[0.5]["prefill_overlap"] - 0.1 < got[1.0]["prefill_overlap"] - 0.2
    assert abs(got[0.0]["prefill_overlap"]) < 0.15  # independent rankings: no correlation beyond noise
    assert got[0.0]["skew"] == pytest.approx(got[1.0]["skew"], abs=0.01)  # the decode's popularity unchanged


def test_the_shape_kept_is_the_one_whose_head_share_comes_closest_among_good_fits() -> None:
    assert choose_shape({"zipf": (1e-5, 0.40), "lognormal": (2e-5, 0.33)}, 0.34) == "lognormal"
    assert choose_shape({"zipf": (1e-5, 0.36), "lognormal": (2e-5, 0.33)}, 0.355) == "zipf"
    assert choose_shape({"zipf": (1e-5, 0.40), "lognormal": (0.01, 0.34)}, 0.34) == "zipf"  # a misfit: not kept
    assert choose_shape({"zipf": (1e-5, 0.40), "lognormal": (1e-5, 0.34)}, math.nan) == "zipf"
    # head shares within HEAD_SHARE_TIE of the closest tie: the lower misfit decides (mini's fits)
    assert choose_shape({"zipf": (2.3e-4, 0.2616), "lognormal": (5.9e-4, 0.2611)}, 0.2393) == "zipf"
    assert choose_shape({"zipf": (5.9e-4, 0.2616), "lognormal": (2.3e-4, 0.2611)}, 0.2393) == "lognormal"
    assert choose_shape({"zipf": (2.3e-4, 0.2700), "lognormal": (5.9e-4, 0.2611)}, 0.2393) == "lognormal"


def test_fit_keeps_the_lognormal_shape_of_a_lognormal_trace() -> None:
    true = RoutingRegime(skew=1.6, shared=0.5, locality=0.2, lognormal=1.0)
    trace = generate(true, TraceShape("ar", [0] * 6, [64] * 6, 16), SMALL, seed=3)  # no prefill: fewer knobs
    fitted, record = fit(trace)
    assert record["popularity"]["chosen"] == "lognormal" and fitted.lognormal == 1.0
    head = record["popularity"]
    assert head["head_share_lognormal"] == pytest.approx(trace_head_share(trace, SMALL.top_k), abs=0.01)
    assert abs(head["head_share_zipf"] - head["head_share_target"]) > abs(head["head_share_lognormal"] -
                                                                         head["head_share_target"])
