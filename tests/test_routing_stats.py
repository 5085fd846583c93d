"""Routing statistics on hand-made traces."""

from __future__ import annotations

import math

import pytest
import torch

from harness.decoding import StepInfo
from harness.errors import HarnessError
from harness.routing_stats import main, routing_statistics
from harness.trace import RoutingTrace


def _trace(rows: list[list[int]], kinds: list[str] | None = None) -> RoutingTrace:
    trace = RoutingTrace(1, 4)
    for i, load in enumerate(rows):
        trace.add_step(StepInfo(0, 0, i, i, True, (kinds or ["denoise"] * len(rows))[i]), 4, 4)
        trace.record(0, torch.tensor(load))
    return trace


def test_balanced_and_concentrated_routing():
    balanced = routing_statistics(_trace([[1, 1, 1, 1], [2, 2, 2, 2]]), bs=(1, 2))
    assert balanced["load_entropy"] == pytest.approx(1.0)
    assert balanced["top1_share_trace"] == pytest.approx(0.25) and balanced["top2_share_step"] == pytest.approx(0.5)
    assert balanced["experts_used_per_step"] == 4
    # each step uses one expert, but a different one: concentrated per step, balanced overall
    rotating = routing_statistics(_trace([[4, 0, 0, 0], [0, 4, 0, 0]]), bs=(1,))
    assert rotating["top1_share_step"] == 1.0 and rotating["top1_share_trace"] == pytest.approx(0.5)
    assert rotating["load_entropy"] == pytest.approx(math.log(2) / math.log(4))
    assert rotating["experts_used_per_step"] == 1


def test_only_denoise_steps_count():
    stats = routing_statistics(_trace([[9, 0, 0, 0], [1, 1, 1, 1]], ["commit", "denoise"]), bs=(1,))
    assert stats["forwards"] == 1 and stats["top1_share_trace"] == pytest.approx(0.25)
    with pytest.raises(HarnessError, match="no denoising steps"):
        routing_statistics(_trace([[1, 0, 0, 0]], ["prefill"]))


def test_cli_prints_the_statistics_and_a_missing_trace_is_exit_2(tmp_path, capsys):
    path = _trace([[1, 1, 1, 1]]).save(tmp_path / "t.npz")
    assert main([str(path), "2"]) == 0
    assert "top2_share_trace: 0.5" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.npz")]) == 2
