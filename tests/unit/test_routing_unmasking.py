"""The `unmasking` knob of generated routing (docs/routing-regimes.md): cohesion that fades
over a block's denoising steps. At its default (0) a regime generates the trace it generated
before the knob existed, bit for bit; at 1 a block's early steps route alike and its late
ones diverge; an autoregressive trace has no statistic for it. Its recovery by `fit`, which
fits it with per-token unmasking: tests/unit/test_routing_redraw.py."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import replace

import pytest

from harness.placement.trace import RoutingTrace
from harness.routing.generate import Dims, generate
from harness.routing.moments import trace_moments
from harness.routing.params import RoutingRegime, TraceShape

SMALL = Dims(6, 32, 4, {"num_experts_per_tok": 4}, "small")
OLD = RoutingRegime(skew=0.8, shared=0.4, locality=0.6, decay=0.3, affinity=0.3, cohesion=0.5)
# sha256 (first 16 hex digits) of the loads the generator made of OLD, seed 7, before the knob
# existed (commit 1b8c0ec, harness/routing/generate.py)
BEFORE = {"block": "4faefa9d4f3b2fed", "canvas": "7773d923f6331413"}
SHAPES = {"block": TraceShape("block", [64, 32], [64, 96], 16, [[5, 3, 7, 2], [4, 6, 2, 8, 3, 5, 1]]),
          "canvas": TraceShape("canvas", [20, 12], [32, 32], 16, [[5, 3], [6, 2]])}


@pytest.mark.parametrize("mode", sorted(SHAPES))
def test_unmasking_zero_generates_the_trace_of_before_the_knob_bit_for_bit(mode: str) -> None:
    assert OLD.unmasking == 0.0
    loads = generate(OLD, SHAPES[mode], SMALL, seed=7).loads.numpy()
    assert hashlib.sha256(loads.tobytes()).hexdigest()[:16] == BEFORE[mode]


def _distinct(trace: RoutingTrace) -> tuple[float, float, float]:
    """Mean distinct experts per layer of the blocks' first denoising steps, of their later
    ones, and of the commits."""
    loads = trace.loads.numpy()

    def mean(rows: list[int]) -> float:
        return float((loads[rows] > 0).sum(-1).mean())

    first = [i for i, s in enumerate(trace.steps) if s.kind == "denoise" and s.step == 0]
    later = [i for i, s in enumerate(trace.steps) if s.kind == "denoise" and s.step > 0]
    return mean(first), mean(later), mean([i for i, s in enumerate(trace.steps) if s.kind == "commit"])


def test_cohesion_fades_over_a_blocks_steps_at_unmasking_one_and_stays_flat_at_zero() -> None:
    shape = TraceShape("block", [32] * 6, [128] * 6, 16, [[8] * 8] * 6)
    flat = RoutingRegime(skew=0.3, shared=0.5, locality=0.0, cohesion=0.8)
    first, later, commit = _distinct(generate(flat, shape, SMALL, seed=2))
    assert abs(later - first) < 0.5 and abs(commit - first) < 0.5  # the same in expectation (~20 of 32)
    first, later, commit = _distinct(generate(replace(flat, unmasking=1.0), shape, SMALL, seed=2))
    assert later - first > 5.0  # the first step, all tokens masked, takes the anchor set, the later ones fade
    assert commit > later - 0.5  # the commit, every token unmasked, no more alike than the later steps
    halfway = _distinct(generate(replace(flat, unmasking=0.5), shape, SMALL, seed=2))
    assert halfway[0] == first and first < halfway[1] < later  # the first step keeps its cohesion at any unmasking
    stats = [trace_moments(generate(replace(flat, unmasking=u), shape, SMALL, seed=2))["unmasking"]
             for u in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert abs(stats[0]) < 0.01 and all(a < b for a, b in itertools.pairwise(stats))  # fit's statistic rises


def test_an_autoregressive_trace_has_no_unmasking_statistic() -> None:
    trace = generate(RoutingRegime(), TraceShape("ar", [8, 8], [16, 16], 8), SMALL, seed=1)
    assert math.isnan(trace_moments(trace)["unmasking"])
