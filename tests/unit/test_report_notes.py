"""The report's notes (harness/report/notes.py): routing statistics of replayed traces, the
flatness of TIDE's tau curve, and decodes that stopped early at EOS, on hand-made records."""

from __future__ import annotations

import re

from harness.placement.trace import RoutingTrace
from harness.report.notes import early_stop_markdown, replay_routing, tau_flatness_markdown
from harness.traces.routing_stats import routing_statistics
from tests.conftest import REPO

GOLDEN_TRACE = REPO / "tests" / "golden" / "mini" / "trace.npz"


def record(**fields):
    base = {"model": "mini", "weights": "random-proxy", "decode_cache": "none", "gen_length": 256, "block_length": 32,
            "budget": "10GB", "experts": 64, "system": "tide", "order": 0.0, "routing": None, "source": "run"}
    return {**base, **fields}


def test_the_tau_curve_spread_is_max_over_min_minus_one():
    text = tau_flatness_markdown([record(tau_curve=[1.2, 1.0, 1.1, 1.05], tau_star=2.0)])
    assert "| 256-64-10GB | mini | 32 | tide | 2 | 1 / 1.2 | 20.0% | 1.200x |" in re.sub(" +", " ", text)
    assert tau_flatness_markdown([record()]) == ""


def test_a_decode_short_of_prompts_times_gen_length_is_flagged():
    text = early_stop_markdown([record(generated_tokens=1324.0, prompts=8.0, system="fiddler"),
                                record(generated_tokens=2048.0, prompts=8.0)])
    assert "- 256-64-10GB, mini, 32 fiddler: decoded 1324 of 2048 tokens (stopped at EOS)" in text
    assert "tide:" not in text
    assert early_stop_markdown([record(generated_tokens=2048.0, prompts=8.0)]) == ""


def test_a_bucket_trimmed_decode_is_judged_against_what_it_asked_for():
    """decode.gen_length_bucket asks each prompt for fewer than gen_length tokens: a run that
    decoded all of them did not stop at EOS, one short of requested_tokens did."""
    assert early_stop_markdown([record(generated_tokens=1900.0, requested_tokens=1900.0, prompts=8.0)]) == ""
    text = early_stop_markdown([record(generated_tokens=1762.0, requested_tokens=1900.0, prompts=8.0)])
    assert "tide: decoded 1762 of 1900 tokens (stopped at EOS)" in text


def test_replays_get_the_routing_statistics_of_their_trace_once_per_row():
    records = [record(trace=str(GOLDEN_TRACE), system=s) for s in ("tide", "fiddler")]
    rows = replay_routing(records)
    key = ("mini", 256, 32, "10GB")  # the main table's row key
    assert list(rows) == [key]
    assert {k: v for k, v in rows[key].items() if k != "record"} == routing_statistics(
        RoutingTrace.load(GOLDEN_TRACE), 64)
    live = [*records, record(trace=str(GOLDEN_TRACE), system="gpu_only", routing={"B": 64})]
    assert replay_routing(live) == {}  # the row has a live run's own recording
    assert replay_routing([record(trace="/no/such/trace.npz")]) == {}
