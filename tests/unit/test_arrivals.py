"""Serving with arrivals and continuous batching (harness/traces/arrivals.py) on the
hand-made recording of test_serving.py, with a forward cost that depends on what a forward
carries (so a request served alone and one sharing forwards are told apart)."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from harness.common.errors import HarnessError
from harness.placement.trace import RoutingTrace
from harness.traces.arrivals import arrival_figures, check_arrivals, continuous, poisson_arrivals
from harness.traces.serving import lockstep, serving_figures
from tests.unit.test_serving import FORWARDS, recording


def cost(trace: RoutingTrace, s: int) -> float:
    """Modeled seconds of forward s: 0.5 s plus 0.01 s per token routed in it."""
    return 0.5 + 0.01 * int(trace.loads[s].sum())


def solo_latencies() -> list[float]:
    """Each request's latency served alone: the sum of its own forwards' costs."""
    alone = lockstep(recording(), 1)
    merged = alone.trace
    out, at = [], 0
    for members in alone.requests:
        n = members[0].forwards
        out.append(sum(cost(merged, s) for s in range(at, at + n)))
        at += n
    return out


def test_arrivals_spaced_beyond_service_are_served_alone() -> None:
    gap = 2 * sum(solo_latencies())  # longer than any request's whole service
    arrivals = [p * gap for p in range(len(FORWARDS))]
    served = continuous(recording(), 4, arrivals, cost)
    figures = arrival_figures(served)
    assert served.running == [1] * sum(FORWARDS.values())
    assert served.starts == arrivals  # no queueing
    e2e = [served.ends[p][-1] - arrivals[p] for p in range(3)]
    assert e2e == pytest.approx(solo_latencies(), rel=1e-12)
    assert figures["queue_p99_s"] == 0.0
    assert torch.equal(served.trace.loads, recording().loads)  # every forward is one request's own


def test_all_at_zero_with_room_for_all_is_lockstep() -> None:
    n = len(FORWARDS)
    served = continuous(recording(), n, [0.0] * n, cost)
    step = lockstep(recording(), n)
    assert torch.equal(served.trace.loads, step.trace.loads)
    assert served.trace.n_tokens == step.trace.n_tokens and served.trace.n_context == step.trace.n_context
    assert [s.kind for s in served.trace.steps] == [s.kind for s in step.trace.steps]
    assert torch.equal(torch.stack([served.trace.step_hints(s) for s in range(len(served.trace))]),
                       torch.stack([step.trace.step_hints(s) for s in range(len(step.trace))]))
    expected = serving_figures([cost(step.trace, s) for s in range(len(step.trace))], step.requests)
    got = arrival_figures(served)
    for key in ("tpot_p50_s", "tpot_p90_s", "e2e_latency_p50_s", "e2e_latency_p99_s", "e2e_latency_mean_s"):
        assert got[key] == pytest.approx(expected[key], rel=1e-12), key
    assert got["ttft_p50_s"] == pytest.approx(cost(step.trace, 0))  # every prefill is the first forward
    assert got["queue_p99_s"] == 0.0


def test_capacity_is_never_exceeded_and_slots_refill() -> None:
    # all at 0, two slots: prompts 0 (3 forwards) and 1 (2) start; 1 leaves after 2 forwards, 2 joins
    served = continuous(recording(), 2, [0.0, 0.0, 0.0], cost)
    assert served.running == [2, 2, 2, 1, 1]
    assert max(served.running) <= 2 and arrival_figures(served)["serving_peak_running"] == 2
    assert served.first == [0, 0, 2]
    assert served.starts[2] == pytest.approx(cost(served.trace, 0) + cost(served.trace, 1))
    # forward 2 carries prompt 0's third forward (3 per layer) and prompt 2's prefill (21 per layer)
    assert int(served.trace.loads[2].sum()) == 2 * 3 + 2 * 21
    assert [s.kind for s in served.trace.steps] == ["prefill", "decode", "decode", "decode", "decode"]


def test_idle_gap_jumps_to_the_next_arrival() -> None:
    served = continuous(recording(), 2, [0.0, 100.0, 100.0], cost)
    assert served.starts == [0.0, 100.0, 100.0]
    assert [s.prompt for s in served.trace.steps] == [0, 0, 0, 1, 1, 1]  # one busy period after another


def test_a_seeded_poisson_schedule_is_reproducible() -> None:
    a, b = poisson_arrivals(50, 4.0, 7), poisson_arrivals(50, 4.0, 7)
    assert a == b and a != poisson_arrivals(50, 4.0, 8)
    assert all(x <= y for x, y in pairwise(a)) and a[0] > 0
    assert len(a) == 50
    served = [arrival_figures(continuous(recording(), 2, poisson_arrivals(3, 1.0, 3), cost)) for _ in range(2)]
    assert served[0] == served[1]


@pytest.mark.parametrize(("kind", "rate", "message"), [
    ("poisson", None, "needs workload.arrival_rate"),
    ("poisson", -1.0, "must be a positive number"),
    ("poisson", 0, "must be a positive number"),
    ("bursty", 1.0, "is not one of static, poisson, trace"),
])
def test_bad_arrivals_are_one_line_errors(kind: str, rate: float | None, message: str) -> None:
    with pytest.raises(HarnessError, match=message) as info:
        check_arrivals(kind, rate)
    assert "\n" not in str(info.value)


def test_engine_forward_charges_what_a_replay_charges() -> None:
    """One request at time 0: the forward-by-forward engine gives the replay's summary."""
    from harness.accounting.cost import CostModel, HardwareConfig
    from harness.bench import synthetic_trace
    from harness.cli.overrides import compose_checked
    from harness.engine.engine import OffloadEngine
    from harness.traces.arrivals import engine_forward
    from harness.traces.batch_replay import summary_differences
    from harness.zoo.entry import nominal_geometry
    from systems.registry import make_system

    g = nominal_geometry(compose_checked(["model=tiny"]).model)
    trace = synthetic_trace(g, steps=12, tokens=16, block=4, seed=1)
    assert len({s.prompt for s in trace.steps}) == 1
    summaries = []
    for continuous_run in (False, True):
        system = make_system("mixtral_offload", {})
        engine = OffloadEngine(system, g, 24, CostModel(g, HardwareConfig()))
        engine.prepare(trace if system.needs_calibration else None, 4)
        if continuous_run:
            served = continuous(trace, 1, [0.0], engine_forward(engine))
            summaries.append(engine.summary())
            assert served.latencies == [p["modeled_latency_s"] for p in summaries[-1]["step_series"]]
        else:
            summaries.append(engine.replay(trace))
    assert summary_differences(summaries[0], summaries[1], rel=0.0) == []
