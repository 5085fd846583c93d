"""The masked state of generated routing (docs/routing-regimes.md): with `mask_overlap` a
still-masked token draws from (and a forward's anchor set is drawn from) the masked state's own
popularity; with `masked_locality` a still-masked token's slots reuse with that probability
instead of `locality`. Unset, or at their meaning when unset, the trace is bit for bit the one of
before; each statistic follows its knob; both need per-token unmasking; autoregressive
routing has neither."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from harness.common.errors import HarnessError
from harness.regimes.grid import reuse_at
from harness.routing.fit import fit
from harness.routing.generate import NO_REDRAW, Dims, Router, Unmasked, generate
from harness.routing.moments import trace_moments
from harness.routing.params import RoutingRegime, TraceShape

SMALL = Dims(4, 32, 4, {"num_experts_per_tok": 4}, "small")
BLOCKS = TraceShape("block", [32] * 3, [96] * 3, 16, [[12] * 6] * 3)
BASE = RoutingRegime(skew=0.8, shared=0.5, locality=0.8, decay=0.3, cohesion=0.3, unmasking=0.5, unmask_redraw=0.3)
N = 64  # tokens of the hand-made forwards


def _with(**knobs: float) -> RoutingRegime:
    return RoutingRegime(**{**BASE.as_dict(), **knobs})


def _loads(regime: RoutingRegime, shape: TraceShape = BLOCKS, seed: int = 4) -> np.ndarray:
    return generate(regime, shape, SMALL, seed=seed).loads.numpy()


def _states(masked: bool) -> Unmasked:
    return Unmasked(np.full(N, masked), np.full(N, NO_REDRAW))


def test_at_their_meaning_when_unset_the_trace_is_the_one_of_before_bit_for_bit() -> None:
    before = _loads(BASE)
    np.testing.assert_array_equal(_loads(_with(mask_overlap=1.0)), before)
    np.testing.assert_array_equal(_loads(_with(masked_locality=BASE.locality)), before)
    assert not np.array_equal(_loads(_with(mask_overlap=0.0)), before)
    assert not np.array_equal(_loads(_with(masked_locality=0.1)), before)


def test_a_masked_token_draws_from_the_masked_popularity_and_an_unmasked_one_from_the_decoding_one() -> None:
    """At skew 3 each popularity puts most of a layer's draws on its own few experts; at
    mask_overlap 0 the masked state's are other experts than the decoding state's."""
    router = Router(RoutingRegime(skew=3.0, shared=1.0, locality=0.0, mask_overlap=0.0, unmask_redraw=0.5),
                    SMALL, 1, seed=5)
    decoding, masked = router.decode_logp[0], router.masked_logp[0]
    top = {name: np.argsort(-logp, axis=-1)[:, :4] for name, logp in (("decoding", decoding), ("masked", masked))}
    assert np.mean([len(set(a) & set(b)) for a, b in zip(top["decoding"], top["masked"], strict=True)]) < 2

    def share_on(ids: np.ndarray, experts: np.ndarray) -> float:
        return float(np.mean([np.isin(ids[:, layer], experts[layer]).mean() for layer in range(SMALL.n_layers)]))

    as_masked = router.route(decoding, N, [], unmasked=_states(True), masked_logp=masked)
    as_unmasked = router.route(decoding, N, [], unmasked=_states(False), masked_logp=masked)
    assert share_on(as_masked, top["masked"]) > 0.6 > share_on(as_masked, top["decoding"]) + 0.3
    assert share_on(as_unmasked, top["decoding"]) > 0.6 > share_on(as_unmasked, top["masked"]) + 0.3


def test_a_masked_token_reuses_at_masked_locality_and_an_unmasked_one_at_locality() -> None:
    """Hand-made source step on experts 0..3, which the fresh draws never reach: the share of
    slots kept is the reuse probability."""
    source = np.broadcast_to(np.arange(4), (N, SMALL.n_layers, 4)).copy()
    logp = np.full((SMALL.n_layers, SMALL.n_experts), -math.log(SMALL.n_experts - 4), np.float32)
    logp[:, :4] = -100.0
    router = Router(RoutingRegime(skew=0.0, locality=0.9, masked_locality=0.2, unmask_redraw=0.5), SMALL, 1, seed=2)
    kept = {masked: float((router.route(logp, N, [source], unmasked=_states(masked)) < 4).mean())
            for masked in (True, False)}
    assert kept[True] == pytest.approx(0.2, abs=0.06) and kept[False] == pytest.approx(0.9, abs=0.06)


@pytest.mark.parametrize("knob", ["mask_overlap", "masked_locality"])
def test_each_statistic_rises_with_its_knob(knob: str) -> None:
    values = (0.0, 0.5, 0.95) if knob == "mask_overlap" else (0.1, 0.5, 0.9)
    got = [trace_moments(generate(_with(**{knob: v}), BLOCKS, SMALL, seed=2))[knob] for v in values]
    assert all(b > a + 0.05 for a, b in itertools.pairwise(got)), got


def test_they_need_per_token_unmasking_and_autoregressive_routing_has_neither() -> None:
    with pytest.raises(HarnessError, match="mask_overlap acts on a token's masked state: set unmask_redraw"):
        RoutingRegime(mask_overlap=0.5)
    with pytest.raises(HarnessError, match=r"masked_locality=1\.5 must be a number in"):
        RoutingRegime(masked_locality=1.5, unmask_redraw=0.5)
    ar = TraceShape("ar", [8, 8], [16, 16], 8)
    stats = trace_moments(generate(_with(mask_overlap=0.2, masked_locality=0.1), ar, SMALL, seed=1))
    assert math.isnan(stats["mask_overlap"]) and math.isnan(stats["masked_locality"])
    np.testing.assert_array_equal(_loads(_with(mask_overlap=0.2), ar), _loads(BASE, ar))


def test_the_regime_map_keeps_the_anchors_ratio_of_masked_to_all_reuse_along_its_locality_axis() -> None:
    anchor = RoutingRegime(locality=0.8, masked_locality=0.4, unmask_redraw=0.5)
    assert reuse_at(anchor, "masked_locality", 0.6) == pytest.approx(0.3)
    assert reuse_at(anchor, "solo_locality", 0.6) is None


def test_fit_searches_them_when_asked_and_matches_their_statistics() -> None:
    """On a trace this small (3 requests) other knobs trade with them (measured: mask_overlap
    fitted 0.58 for 0.2, unmask_redraw 0.43 for 0.3, at the same statistics), so the test holds
    the statistics, as the fit does; unset, mask_overlap's statistic here is 0.80, not 0.57."""
    true = RoutingRegime(skew=0.8, shared=0.5, locality=0.8, decay=0.3, cohesion=0.4, unmasking=0.5,
                         unmask_redraw=0.3, mask_overlap=0.2, masked_locality=0.4)
    trace = generate(true, BLOCKS, SMALL, seed=1)
    fitted, record = fit(trace, popularity=("zipf",), also=("mask_overlap", "masked_locality"))
    assert fitted.mask_overlap is not None and fitted.masked_locality is not None
    assert record["searched_also"] == ["mask_overlap", "masked_locality"]
    for knob in ("mask_overlap", "masked_locality"):
        stats = record["statistics"][knob]
        assert abs(stats["reached"] - stats["target"]) < 0.03, (knob, stats)
    with pytest.raises(HarnessError, match="also='cohesion' is no knob fit can search besides its own"):
        fit(trace, also=("cohesion",))
    with pytest.raises(HarnessError, match="also='cohesion' is no knob fit can search besides its own"):
        fit(trace, also=("cohesion",))


def test_the_hints_expect_what_the_masked_tokens_route() -> None:
    """With hint_quality 0 a hint is the next layer's expected load; at a block's first denoising
    step every token is masked, so with mask_overlap the expectation is the masked state's, and
    at its commit (every token unmasked) the decoding one's, as a model's gates predict the window."""
    regime = _with(mask_overlap=0.0, hint_quality=0.0)
    trace = generate(regime, BLOCKS, SMALL, seed=4)
    router = Router(regime, SMALL, BLOCKS.requests, seed=4)
    first = next(i for i, s in enumerate(trace.steps) if s.kind == "denoise" and s.prompt == 0)
    commit = next(i for i, s in enumerate(trace.steps) if s.kind == "commit" and s.prompt == 0)
    tokens = BLOCKS.block * SMALL.top_k
    for step, logp in ((first, router.masked_logp[0]), (commit, router.decode_logp[0])):
        hint = trace.step_hints(step).numpy()  # [L, E]: layer l's hint of layer l + 1
        np.testing.assert_allclose(hint[:-1], np.exp(logp[1:]) * tokens, rtol=1e-5)
