"""`solo_locality` of generated routing (docs/routing-regimes.md): a diffusion slot whose
expert had its token alone at the step it would reuse from is reused with this probability
instead of `locality`, so a block's light experts come and go whole while its shared ones stay.
Unset, or equal to locality, the trace is bit for bit the one of before; its statistic (how
often a one-token expert is routed again the next step) follows it; autoregressive routing
ignores it."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from harness.common.errors import HarnessError
from harness.routing.generate import Dims, Router, generate
from harness.routing.moments import trace_moments
from harness.routing.params import RANGES, RoutingRegime, TraceShape

SMALL = Dims(4, 32, 4, {"num_experts_per_tok": 4}, "small")
BLOCKS = TraceShape("block", [32] * 3, [96] * 3, 16, [[12] * 6] * 3)
BASE = RoutingRegime(skew=0.8, shared=0.5, locality=0.8, decay=0.3, cohesion=0.3, unmask_redraw=0.3)


def _loads(trace) -> np.ndarray:
    return trace.loads.numpy()


def test_solo_locality_equal_to_locality_or_unset_is_the_trace_of_before_bit_for_bit() -> None:
    unset = generate(BASE, BLOCKS, SMALL, seed=4)
    same = generate(RoutingRegime(**{**BASE.as_dict(), "solo_locality": BASE.locality}), BLOCKS, SMALL, seed=4)
    np.testing.assert_array_equal(_loads(same), _loads(unset))
    other = generate(RoutingRegime(**{**BASE.as_dict(), "solo_locality": 0.2}), BLOCKS, SMALL, seed=4)
    assert not np.array_equal(_loads(other), _loads(unset))


def test_autoregressive_routing_ignores_it() -> None:
    ar = TraceShape("ar", [8, 8], [16, 16], 8)
    a = generate(BASE, ar, SMALL, seed=1)
    b = generate(RoutingRegime(**{**BASE.as_dict(), "solo_locality": 0.1}), ar, SMALL, seed=1)
    np.testing.assert_array_equal(_loads(a), _loads(b))
    assert math.isnan(trace_moments(a)["solo_locality"])


def test_a_token_alone_on_an_expert_drops_it_and_shared_experts_stay() -> None:
    """Hand-made source step: tokens 0 and 1 share expert 0 and each has one expert alone
    (1, 2); the fresh draws never reach experts 0..3. At solo_locality 0 a token never keeps
    its lone expert; shared expert 0 is kept in nearly every slot that reuses it."""
    n, (L, E, k) = 2, (SMALL.n_layers, SMALL.n_experts, SMALL.top_k)
    source = np.zeros((n, L, k), dtype=np.int64)
    source[0, :] = [0, 1, 10, 11]
    source[1, :] = [0, 2, 10, 11]  # 10 and 11 shared too
    logp = np.full((L, E), -math.log(E - 4), np.float32)
    logp[:, :4] = -100.0
    lone = shared = 0
    for seed in range(20):
        router = Router(RoutingRegime(skew=0.0, shared=1.0, locality=0.95, cohesion=0.0, solo_locality=0.0),
                        SMALL, 1, seed=seed)
        ids = router.route(logp, n, [source], same_tokens=True)
        lone += int((ids[0] == 1).sum() + (ids[1] == 2).sum())
        shared += int((ids == 0).sum())
    assert lone == 0
    assert shared >= 0.85 * 20 * n * L  # 0.95 expected
    with pytest.raises(HarnessError, match=r"solo_locality=1\.5 must be a number in"):
        RoutingRegime(solo_locality=1.5)


def test_its_statistic_rises_with_it() -> None:
    kept = [trace_moments(generate(RoutingRegime(**{**BASE.as_dict(), "solo_locality": v}), BLOCKS, SMALL,
                                   seed=2))["solo_locality"] for v in (0.1, 0.5, 0.9)]
    assert all(b > a + 0.05 for a, b in itertools.pairwise(kept)), kept


def test_the_regime_map_keeps_the_anchors_ratio_of_lone_to_all_reuse_along_its_locality_axis() -> None:
    from harness.regimes.grid import reuse_at

    anchor = RoutingRegime(locality=0.8, solo_locality=0.4)
    assert reuse_at(anchor, "solo_locality", 0.6) == pytest.approx(0.3)
    capped = RoutingRegime(locality=0.5, solo_locality=0.9)
    assert reuse_at(capped, "solo_locality", 0.9) == RANGES["solo_locality"][1]
    assert reuse_at(RoutingRegime(locality=0.8), "solo_locality", 0.6) is None
