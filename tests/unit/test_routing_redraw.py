"""Per-token unmasking (`unmask_redraw`) and the hints' sharpness (`hint_sharpness`) of
generated routing (docs/routing-regimes.md): a redrawn token reuses nothing from before its
redraw; a masked token keeps the forward's cohesion and an unmasked one loses `unmasking` of
it; a block's long memory falls as unmask_redraw rises; the hints' flatness follows the power;
`fit` reads both back from a trace that has them (with `solo_locality`, tests/unit/test_routing_solo.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from harness.common.errors import HarnessError
from harness.routing.fit import fit, fit_hint_sharpness
from harness.routing.generate import NO_REDRAW, Dims, Router, Unmasked, generate
from harness.routing.moments import hint_entropy, shape_of, trace_moments
from harness.routing.params import RoutingRegime, TraceShape

SMALL = Dims(6, 32, 4, {"num_experts_per_tok": 4}, "small")
N = 64  # tokens of the hand-made forwards
BLOCKS = TraceShape("block", [32] * 4, [96] * 4, 16, [[12] * 6] * 4)
# |fitted - true| on the synthetic trace of the last test (measured 0.016, 0.137, 0.054, 0.025;
# before solo_locality joined the fit 0.041, 0.085, 0.014: the extra freedom traded with skew,
# fitted 0.70 for 0.8, which the hints' flatness follows; docs/routing-regimes.md); 4 requests
# pinned too little: locality 0.83 and unmask_redraw 0.15 matched the same statistics as 0.9 and 0.6
RECOVERY_SHAPE = TraceShape("block", [32] * 8, [96] * 8, 16, [[12] * 6] * 8)
RECOVERY_TOLERANCE = {"unmasking": 0.1, "unmask_redraw": 0.2, "hint_sharpness": 0.08, "solo_locality": 0.1}


def _router(**knobs: float) -> Router:
    return Router(RoutingRegime(**{"skew": 0.0, "shared": 1.0, "locality": 0.0, "cohesion": 0.0, **knobs}),
                  SMALL, 1, seed=3)


def _uniform_logp() -> np.ndarray:
    return np.full((SMALL.n_layers, SMALL.n_experts), -math.log(SMALL.n_experts), np.float32)


def _state(masked: bool, since: int) -> Unmasked:
    return Unmasked(np.full(N, masked), np.full(N, since))


def test_a_redrawn_token_reuses_nothing_from_before_its_redraw() -> None:
    router = _router(locality=0.99, decay=0.9, unmask_redraw=1.0)
    newer = np.broadcast_to(np.arange(4), (N, SMALL.n_layers, 4)).copy()  # the step before: experts 0..3
    older = newer + 4  # two steps before: 4..7
    in_older = {}
    for since in (NO_REDRAW, 1, 0):
        ids = router.route(_uniform_logp(), N, [newer, older], unmasked=_state(False, since))
        in_older[since] = float(np.isin(ids, older).mean())
        if since == 0:  # the redraw itself: fresh draws, experts 0..7 no likelier than any others
            assert float(np.isin(ids, np.arange(8)).mean()) < 0.4
    assert in_older[NO_REDRAW] > 0.3  # decay 0.9: reuses from both earlier steps
    assert in_older[1] < 0.03  # one forward after its redraw: only that forward's experts (and chance)


def test_a_masked_token_keeps_cohesion_and_an_unmasked_one_loses_unmasking_of_it() -> None:
    on_top = {}  # the share of a layer's routed pairs on its 4 most used experts
    for masked in (True, False):
        router = _router(cohesion=0.9, unmasking=1.0, unmask_redraw=0.0)
        ids = router.route(_uniform_logp(), N, [], step=3, unmasked=_state(masked, NO_REDRAW))
        counts = np.stack([np.bincount(ids[:, layer].ravel(), minlength=SMALL.n_experts)
                           for layer in range(SMALL.n_layers)])
        on_top[masked] = float((-np.sort(-counts, -1)[:, :4].sum(-1) / counts.sum(-1)).mean())
    assert on_top[True] > 0.5 > 0.25 > on_top[False]  # the anchor set's 4 vs 4 of 32 (~1/8 and noise)


def test_a_blocks_long_memory_falls_as_unmask_redraw_rises_and_unset_is_no_redraw() -> None:
    base = RoutingRegime(skew=0.8, shared=0.5, locality=0.9, decay=0.3, cohesion=0.3)
    memory = [trace_moments(generate(RoutingRegime(**{**base.as_dict(), "unmask_redraw": r}), BLOCKS, SMALL,
                                     seed=2))["unmask_redraw"] for r in (0.0, 0.5, 1.0)]
    assert all(a > b + 0.03 for a, b in itertools.pairwise(memory)), memory
    assert math.isnan(trace_moments(generate(base, TraceShape("ar", [8, 8], [16, 16], 8), SMALL))["unmask_redraw"])
    with pytest.raises(HarnessError, match=r"unmask_redraw=1\.5 must be a number in"):
        RoutingRegime(unmask_redraw=1.5)


def test_hint_sharpness_sets_the_hints_flatness_and_one_keeps_the_popularity() -> None:
    base = RoutingRegime(skew=1.5, shared=0.5, hint_quality=0.0)
    shape = TraceShape("ar", [16] * 3, [24] * 3, 8)

    def hints(**knobs: float) -> np.ndarray:
        trace = generate(RoutingRegime(**{**base.as_dict(), **knobs}), shape, SMALL, seed=1)
        return np.stack([trace.step_hints(i).numpy() for i in range(len(trace))])

    unset, one = hints(), hints(hint_sharpness=1.0)
    np.testing.assert_allclose(one, unset, rtol=1e-5)
    flat = hints(hint_sharpness=0.0)[:, :-1]
    np.testing.assert_allclose(flat, np.broadcast_to(flat[..., :1], flat.shape), rtol=1e-5)  # uniform rows
    entropies = [hint_entropy(hints(hint_sharpness=p)) for p in (0.0, 0.5, 1.0, 2.0)]
    assert entropies[0] == pytest.approx(1.0) and all(a > b for a, b in itertools.pairwise(entropies))


def test_fit_reads_back_unmasking_unmask_redraw_hint_sharpness_and_solo_locality_of_a_synthetic_trace() -> None:
    true = RoutingRegime(skew=0.8, shared=0.5, locality=0.9, decay=0.3, affinity=0.2, cohesion=0.5, unmasking=0.5,
                         prefill_skew=0.8, hint_quality=0.2, unmask_redraw=0.6, hint_sharpness=0.4, solo_locality=0.5)
    trace = generate(true, RECOVERY_SHAPE, SMALL, seed=1)
    fitted, record = fit(trace, popularity=("zipf",))  # the true shape
    for knob, tol in RECOVERY_TOLERANCE.items():
        assert abs(getattr(fitted, knob) - getattr(true, knob)) <= tol, (knob, fitted)
    assert record["statistics"]["hint_sharpness"]["reached"] == pytest.approx(
        record["statistics"]["hint_sharpness"]["target"], abs=0.005)
    again, _ = fit_hint_sharpness(trace, fitted, shape_of(trace), SMALL, 0)
    assert again.hint_sharpness == fitted.hint_sharpness  # seeded: the same power again
