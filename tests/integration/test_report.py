"""The paper-style report on a fixture of hand-made results: pivot, speedups, plots, errors."""

from __future__ import annotations

import csv
import math
import os
import re
from pathlib import Path

import pytest

from harness.common.files import write_json_atomic
from harness.job import mlflow_log as tracking
from harness.report import tables as report
from harness.results import records
from harness.results.run_result import RunResult
from tests.harness_cli import empty_store, sqlite_uri

PNG = b"\x89PNG\r\n\x1a\n"


EXPERTS = {"10GB": 64, "18GB": 128, "30GB": 32}  # B per budget


def result(system: str, budget: str, tps: float, miss: float, tau: object = None, tau_star: float | None = None,
           lossless: int = 1, overlap: bool | None = None) -> dict:
    metrics = {"tokens_per_s": tps, "miss_rate": miss, "io_gb": 0.1, "lossless": lossless}
    if tau_star is not None:
        metrics["tau_star"] = tau_star
    system_cfg = {"name": system, **({"tau": tau, "migration": "sync"} if system == "tide" else {})}
    if overlap is not None:
        system_cfg["overlap"] = overlap
    return {
        "schema": 1, "system": system, "model": "mini", "weights": "proxy", "timing": "modeled",
        "hardware": "a100_pcie4", "decode_cache": "prefix",
        "budget": {"name": budget, "experts_per_layer": EXPERTS[budget]},
        "config": {"model": {"name": "mini"}, "decode": {"gen_length": 32, "block_length": 32, "cache": "prefix"},
                   "system": system_cfg, "budget": {"name": budget}},
        "metrics": metrics,
        "step_series": [{"global_step": g, "kind": "denoise", "block": g // 4, "step": g % 4,
                         "miss_rate": miss * (1 + g % 4) / 4, "modeled_latency_s": 0.01} for g in range(8)],
        "system_report": {},
    }


# (system, budget, tokens/s, miss, tau, tau*), oldest first
FIXTURE = [
    ("tide", "10GB", 100.0, 0.9, "auto", 4),  # superseded by the later auto run below
    ("gpu_only", "10GB", 1000.0, 0.0, None, None),
    ("fiddler", "10GB", 200.0, 0.5, None, None),
    ("mixtral_offload", "10GB", 300.0, 0.4, None, None),
    ("tide", "10GB", 600.0, 0.2, "auto", 4),
    ("oracle", "10GB", 800.0, 0.1, None, None),
    ("tide", "10GB", 400.0, 0.1, "1", None),  # a tau sweep (system.tau is a string): never replaces the auto run
    ("tide", "10GB", 500.0, 0.15, "2", None),
    ("tide", "10GB", 450.0, 0.3, "8", None),
    ("fiddler", "18GB", 400.0, 0.3, None, None),
    ("mixtral_offload", "18GB", 350.0, 0.3, None, None),
    ("tide", "18GB", 700.0, 0.1, "auto", 2),
    ("tide", "30GB", 900.0, 0.05, "auto", 1),
]


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    for i, (system, budget, tps, miss, tau, tau_star) in enumerate(FIXTURE):
        path = write_json_atomic(tmp_path / "runs" / f"{i:02d}_{system}_{budget}" / "result.json",
                                 result(system, budget, tps, miss, tau, tau_star))
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # the fixture's order is the runs' age
    return tmp_path / "runs"


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path) as f:
        return {row["budget"]: row for row in csv.DictReader(f)}


def assert_expected_table(rows: dict[str, dict[str, str]]) -> None:
    assert set(rows) == {"10GB", "18GB", "30GB"}
    ten = rows["10GB"]
    assert float(ten["tide.tokens_per_s"]) == 600.0  # the latest auto run, not a fixed-tau one
    expected = {"gpu_only": 1000 / 300, "fiddler": 200 / 300, "mixtral_offload": 1.0, "tide": 2.0, "oracle": 800 / 300}
    for system, speedup in expected.items():
        assert float(ten[f"{system}.speedup"]) == pytest.approx(speedup)
    assert float(ten["tide.tau_star"]) == 4 and float(ten["tide.miss_rate"]) == 0.2
    eighteen = rows["18GB"]
    assert float(eighteen["tide.speedup"]) == pytest.approx(700 / 400)  # best baseline there is fiddler
    assert float(eighteen["mixtral_offload.speedup"]) == pytest.approx(350 / 400)
    assert eighteen["gpu_only.tokens_per_s"] == ""  # not run at 18GB
    assert rows["30GB"]["tide.speedup"] == ""  # no baseline in that row


def test_paper_table_pivot_and_speedups(runs_dir: Path) -> None:
    wide = report.paper_table(report.records_from_dirs([runs_dir]))
    assert list(wide.index.names) == ["model", "gen_length", "block_length", "budget"]
    assert [b for *_, b in wide.index] == ["10GB", "18GB", "30GB"]
    systems = list(dict.fromkeys(s for s, _ in wide.columns))
    # fixed-tau runs are columns of their own, never merged into the tau=auto one (its default)
    assert systems == ["gpu_only", "fiddler", "mixtral_offload", "tide", "tide (tau=1)", "tide (tau=2)",
                       "tide (tau=8)", "oracle"]
    assert wide.loc[("mini", 32, 32, "10GB"), ("tide (tau=2)", "tokens_per_s")] == 500.0
    assert ("tide", "tau_star") in wide.columns and ("fiddler", "tau_star") not in wide.columns
    assert math.isnan(wide.loc[("mini", 32, 32, "30GB"), ("tide", "speedup")])


def test_report_cli_writes_table_csv_and_plots(runs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "report"
    assert report.main(["--runs", str(runs_dir), "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    assert "| 32-64-10GB | mini | 32 | 1000.0 | 3.33x |" in re.sub(" +", " ", printed)  # rows: gen-B-budget
    assert_expected_table(read_csv(out / "report.csv"))
    assert "(modeled)" in (out / "report.md").read_text().splitlines()[0]
    assert (out / "throughput.png").read_bytes()[:8] == PNG
    assert (out / "throughput.pdf").read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in (out / "throughput.svg").read_bytes()[:2000]
    tau_plots = list(out.glob("tau_sweep_*.png"))
    assert len(tau_plots) == 1 and "10GB" in tau_plots[0].name
    assert len(list(out.glob("miss_per_step_*.png"))) == 3
    assert len(list(out.glob("miss_per_step_*.pdf"))) == 3 and len(list(out.glob("miss_per_step_*.svg"))) == 3
    # the two tau=auto runs at 10GB agree on every setting: the newer is used, the older named
    assert err.count("warning: 2 runs with the same settings") == 1 and "00_tide_10GB" in err


def test_report_from_mlflow_matches_the_run_dirs(runs_dir: Path, tmp_path: Path) -> None:
    store = sqlite_uri(empty_store(tmp_path / "mlflow.db"))
    settings = tracking.TrackingConfig(uri=store, experiment="report-test")
    for run_dir in tracking.result_dirs([runs_dir]):  # oldest first, as the fixture was written
        tracking.log_result(RunResult.from_json(run_dir / "result.json"), run_dir, settings)
    out = tmp_path / "from_mlflow"
    assert report.main(["--from-mlflow", store, "--out", str(out)]) == 0
    assert_expected_table(read_csv(out / "report.csv"))


def test_miss_rate_by_step_in_block_averages_over_blocks() -> None:
    series = [{"kind": "prefill", "step": 0, "miss_rate": 1.0},
              {"kind": "denoise", "step": 0, "miss_rate": 0.2}, {"kind": "denoise", "step": 1, "miss_rate": 0.4},
              {"kind": "denoise", "step": 0, "miss_rate": 0.4}, {"kind": "commit", "step": 0, "miss_rate": 1.0}]
    from harness.report.plots import miss_by_step_in_block

    assert miss_by_step_in_block(series) == pytest.approx({0: 0.3, 1: 0.4})


def test_empty_result_set_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert report.main(["--runs", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no runs found") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    assert report.main([str(tmp_path), f"out={tmp_path / 'out'}"]) == 2  # a bare directory is runs=
    assert capsys.readouterr().err.startswith(f"error: no runs found in {tmp_path}")
    assert report.main([str(tmp_path / "nowhere")]) == 2  # not a directory: left to the parser, one line
    assert "unrecognized arguments" in capsys.readouterr().err


def test_tide_charged_sequentially_is_its_own_column(tmp_path: Path) -> None:
    runs = [("tide", 600.0, True), ("tide", 450.0, False), ("fiddler", 300.0, False), ("fiddler", 310.0, True)]
    for i, (system, tps, overlap) in enumerate(runs):
        write_json_atomic(tmp_path / f"{i}" / "result.json", result(system, "10GB", tps, 0.2, "auto", overlap=overlap))
    wide = report.paper_table(report.records_from_dirs([tmp_path]))
    systems = list(dict.fromkeys(s for s, _ in wide.columns))
    assert systems == ["fiddler", "fiddler_overlapped", "tide", "tide_sequential"]  # each beside its variant
    assert wide[("tide_sequential", "tokens_per_s")].tolist() == [450.0]
    assert wide[("tide", "tokens_per_s")].tolist() == [600.0]
    assert wide[("tide", "speedup")].tolist() == [2.0]  # fiddler (its original charging) is the baseline
    assert wide[("tide_sequential", "io_gb")].tolist() == [0.1]  # the table reports host-to-GPU traffic
    assert records.system_label("tide", {"overlap": "false"}) == "tide_sequential"  # an MLflow param
    assert records.system_label("tide", {}) == "tide"
