"""The cost breakdown (harness/accounting/breakdown.py): every run's modeled time split into attention,
other non-expert work, GPU experts, exposed copies and exposed CPU time, per forward, per
phase and by window length, adding up to the modeled time."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from harness.accounting.breakdown import COMPONENTS, by_window, rows_of, shares
from harness.cli.overrides import compose_checked
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.results.run_result import RunResult
from tests.conftest import REPO

register_configs()

GOLDEN = REPO / "tests" / "golden" / "mini"
MINI_REPLAY = ["model=mini", "model.weights=random", "decode.gen_length=32", "source=trace",
               f"trace.path={GOLDEN / 'trace.npz'}", "tracking.enabled=false", "show_text=false"]
VARIANTS = {
    "fiddler": ["system=fiddler"],
    "mixtral_offload": ["system=mixtral_offload"],  # pipelined misses
    "tide+async": ["system=tide", "system.migration=async", "system.tau=2"],  # copies still in flight at the end
    "tide_sequential": ["system=tide", "system.overlap=false"],
    "tide+pageable": ["system=tide", "hardware.host_memory=pageable", "hardware.pcie_pageable_gbps=10"],
}
REL = 1e-12


@pytest.fixture(scope="module", params=list(VARIANTS))
def result(request, tmp_path_factory) -> RunResult:
    out = tmp_path_factory.mktemp(request.param)
    cfg = compose_checked([*MINI_REPLAY, *VARIANTS[request.param], f"cache_dir={out / 'cache'}"])
    run_job(cfg, out)
    return RunResult.from_json(out / "result.json")  # what result.json holds, read back


def test_the_run_total_is_the_sum_of_its_components_exactly(result):
    m = result.metrics
    assert m["modeled_time_s"] == m["time_gpu_experts_s"] + m["time_cpu_experts_s"] + m["time_copies_s"] + \
        m["time_non_expert_s"]


def test_each_forwards_components_add_up_to_its_modeled_latency(result):
    rows, kinds = rows_of(result.cost_breakdown)
    latency = np.array([s["modeled_latency_s"] for s in result.step_series])
    assert len(rows) == len(latency) == len(kinds) > 0
    assert kinds == [s["kind"] for s in result.step_series]
    np.testing.assert_allclose(rows[:, 2:].sum(1), latency, rtol=REL, atol=0)
    assert (rows[:, 2:] >= 0).all()


def test_the_components_summed_over_forwards_are_the_runs_counters(result):
    totals, m = result.cost_breakdown["totals"], result.metrics
    pairs = [(totals["attention_s"] + totals["non_expert_other_s"], m["time_non_expert_s"]),
             (totals["gpu_experts_s"], m["time_gpu_experts_s"]), (totals["copies_exposed_s"], m["time_copies_s"]),
             (totals["cpu_exposed_s"], m["time_cpu_experts_s"]),
             (sum(totals[c] for c in COMPONENTS), m["modeled_time_s"])]
    for mine, theirs in pairs:
        assert math.isclose(mine, theirs, rel_tol=REL), (mine, theirs)
    assert totals["attention_s"] > 0 and totals["non_expert_other_s"] > 0 and totals["gpu_experts_s"] > 0
    assert math.isclose(sum(shares(result.cost_breakdown).values()), 1.0, rel_tol=1e-12)


def test_phases_and_window_bins_partition_the_forwards(result):
    section = result.cost_breakdown
    for name in COMPONENTS:
        assert math.isclose(sum(p[name] for p in section["by_phase"].values()), section["totals"][name],
                            rel_tol=REL, abs_tol=1e-300)
    bins = by_window(section, bin_tokens=16, kinds=("prefill", "denoise", "commit"))
    assert sum(b["forwards"] for b in bins) == len(result.step_series)
    rows, _ = rows_of(section)
    assert [b["window_lo"] for b in bins] == sorted({int(c // 16) * 16 for c in rows[:, 1]})
    for name in COMPONENTS:
        total = sum(b[name] * b["forwards"] for b in bins)
        assert math.isclose(total, section["totals"][name], rel_tol=1e-9, abs_tol=1e-300)


def test_copies_in_flight_at_the_end_of_a_forward_are_exposed_copy_time(tmp_path):
    """tide with async migration: copies the next forward uses, still on the link when this
    one ends, are charged (the link's drain) and belong to the exposed copies."""
    cfg = compose_checked([*MINI_REPLAY, *VARIANTS["tide+async"], f"cache_dir={tmp_path / 'cache'}"])
    run_job(cfg, tmp_path)
    result = RunResult.from_json(tmp_path / "result.json")
    assert result.metrics["copies_async"] > 0 and result.cost_breakdown["totals"]["copies_exposed_s"] > 0


def test_the_report_shows_the_breakdown_table_and_plots_it_by_window(tmp_path):
    from harness.report.tables import records_from_dirs, write_report

    for name in ("fiddler", "tide_sequential"):
        cfg = compose_checked([*MINI_REPLAY, *VARIANTS[name], f"cache_dir={tmp_path / 'cache'}"])
        run_job(cfg, tmp_path / "runs" / name)
    text, figures = write_report(records_from_dirs([tmp_path / "runs"]), tmp_path / "report")
    assert "## Where the modeled time goes" in text
    table = re.sub(" +", " ", text.split("## Where the modeled time goes")[1])
    # the main table's row names (cell gen-B-budget, model, block), then the system
    assert "| 32-64-10GB | mini | 32 | fiddler |" in table and "| 32-64-10GB | mini | 32 | tide_sequential |" in table
    # one figure per row of the table but its gen_length (model, block_length, budget)
    assert [f.name for f in figures if f.name.startswith("breakdown_")] == ["breakdown_mini_32_10GB.png"]
