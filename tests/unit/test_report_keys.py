"""The report never merges runs with different settings (harness/report/keys.py): two runs
that differ in only one setting are two rows, the setting shown as a column; runs that
agree on everything are one row, the newer, with a warning naming the older."""

from __future__ import annotations

import copy
import csv
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.common.files import write_json_atomic
from harness.report import tables as report

Result = dict[str, Any]


def base_result(system: str = "tide", tokens_per_s: float = 100.0) -> Result:
    """A hand-made result.json with every setting a real one records."""
    return {
        "schema": 1, "system": system, "model": "mini", "weights": "random-proxy", "timing": "modeled",
        "hardware": "a100_pcie4", "decode_cache": "prefix", "source": "live", "backend": "cpu",
        "budget": {"name": "custom", "experts_per_layer": 40},
        "config": {
            "model": {"name": "mini", "nominal": "llada2_mini", "path": None, "dtype": "float32", "weights": "random"},
            "decode": {"gen_length": 32, "block_length": 32, "steps": 32, "threshold": 0.95, "cache": "prefix"},
            "workload": {"name": "coding", "prompts": ["def add(a, b):", "def sub(a, b):"]},
            "system": {"name": system, **({"tau": "auto", "migration": "sync"} if system == "tide" else {})},
            "budget": {"name": "custom", "gpu_gb": 12.0, "scope": "per_layer"},
            "hardware": {"name": "a100_pcie4", "pcie_gbps": 25.0}, "source": "live", "limit_prompts": None,
            "backend": "auto", "cache_dir": "outputs/cache", "tracking": {"uri": "sqlite:///x.db"},
        },
        "metrics": {"tokens_per_s": tokens_per_s, "miss_rate": 0.25, "io_gb": 0.5, "lossless": 1},
        "step_series": [], "system_report": {},
    }


def _set(path: str, value: Any) -> Callable[[Result], None]:
    def change(result: Result) -> None:
        *parents, leaf = path.split(".")
        node = result
        for part in parents:
            node = node[part]
        node[leaf] = value
    return change


# (the setting as the report names it, how the second run differs)
ONE_SETTING = {
    "budget.gpu_gb": _set("config.budget.gpu_gb", 8.0),  # budget=custom at 8 GB and at 12 GB
    "workload": _set("config.workload.prompts", ["def mul(a, b):", "def div(a, b):"]),
    "weights": _set("weights", "trained-proxy"),
    "decode.threshold": _set("config.decode.threshold", 0.9),
    "budget.scope": _set("config.budget.scope", "global"),
    "hardware.name": _set("config.hardware.name", "h200_pcie5"),
    "hardware.pcie_gbps": _set("config.hardware.pcie_gbps", 50.0),
    "decode.cache": _set("config.decode.cache", "none"),
    "timing": _set("timing", "measured"),
    "model.path": _set("config.model.path", "/ckpt/llada2-mini"),
    "limit_prompts": _set("config.limit_prompts", 1),  # the workload's digest differs too: one prompt
    "decode.steps": _set("config.decode.steps", 16),
    "workload.batch": _set("config.workload.batch", 16),  # lock-step serving: batch 16 is not batch 64
    "workload.arrivals": _set("config.workload.arrivals", "poisson"),  # arrivals, not static batches
    "calibration": _set("config.calibration", {"prompts": [], "from_workload": 4}),
    "decode.gen_length_bucket": _set("config.decode.gen_length_bucket", 32),
    "decode.temperature": _set("config.decode.temperature", 1.0),  # table1 vs table1_greedy
    "model.expert_sum_order": _set("config.model.expert_sum_order", "expert_id"),
}


def write_runs(root: Path, results: list[Result]) -> Path:
    for i, data in enumerate(results):
        path = write_json_atomic(root / f"run{i}" / "result.json", data)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # the list's order is the runs' age
    return root


@pytest.mark.parametrize("setting", list(ONE_SETTING))
def test_runs_differing_in_one_setting_are_two_rows(setting: str, tmp_path: Path) -> None:
    first, second = base_result(tokens_per_s=100.0), base_result(tokens_per_s=200.0)
    ONE_SETTING[setting](second)
    out = tmp_path / "report"
    assert report.main(["--runs", str(write_runs(tmp_path / "runs", [first, second])), "--out", str(out)]) == 0
    with open(out / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2, rows
    assert setting in rows[0]  # the setting is a column of the wide table ...
    assert len({row[setting] for row in rows}) == 2  # ... with each run's own value
    assert sorted(float(row["tide.tokens_per_s"]) for row in rows) == [100.0, 200.0]
    others = set(ONE_SETTING) - {setting} - ({"workload"} if setting == "limit_prompts" else set())
    assert not others & set(rows[0]), "a setting that does not differ is no column"
    header = (out / "report.md").read_text().split("\n")[2]
    assert f"| {setting} |" in " ".join(header.split())


def test_every_setting_differing_at_once_keeps_every_run(tmp_path: Path) -> None:
    results = [base_result(tokens_per_s=100.0)]
    for i, change in enumerate(ONE_SETTING.values()):
        result = copy.deepcopy(base_result(tokens_per_s=200.0 + i))
        change(result)
        results.append(result)
    wide = report.paper_table(report.records_from_dirs([write_runs(tmp_path, results)]))
    assert len(wide) == len(results)
    assert set(ONE_SETTING) <= set(wide.index.names)


def test_same_settings_keep_the_newer_run_and_name_the_older(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = write_runs(tmp_path / "runs", [base_result(tokens_per_s=100.0), base_result(tokens_per_s=150.0),
                                          base_result("fiddler", 50.0)])
    out = tmp_path / "report"
    assert report.main(["--runs", str(runs), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1
    assert "2 runs with the same settings" in lines[0] and "system=tide" in lines[0]
    assert lines[0].index("run1") < lines[0].index("run0")  # uses run1 (newer), leaves out run0 (older)
    with open(out / "report.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["tide.tokens_per_s"]) == 150.0 and float(row["tide.speedup"]) == 3.0


def test_a_static_run_from_before_the_arrival_settings_is_the_same_row(tmp_path: Path) -> None:
    """A result written before workload.arrivals existed lacks the keys a static run of today
    holds at their defaults: the same settings, one row (the newer); a rate is a column."""
    today, poisson = base_result(tokens_per_s=150.0), base_result(tokens_per_s=300.0)
    today["config"]["workload"].update(arrivals="static", arrival_rate=None, arrival_seed=0, arrival_trace=None)
    poisson["config"]["workload"].update(arrivals="poisson", arrival_rate=4.0, arrival_seed=0, arrival_trace=None)
    wide = report.paper_table(report.records_from_dirs([write_runs(tmp_path, [base_result(), today, poisson])]))
    assert len(wide) == 2 and {"workload.arrivals", "workload.arrival_rate"} <= set(wide.index.names)
    assert sorted(wide[("tide", "tokens_per_s")].tolist()) == [150.0, 300.0]


def test_system_options_label_the_column_not_the_row(tmp_path: Path) -> None:
    second = base_result(tokens_per_s=300.0)
    second["config"]["system"]["migration"] = "async"
    runs = write_runs(tmp_path, [base_result(tokens_per_s=100.0), second, base_result("fiddler", 50.0)])
    wide = report.paper_table(report.records_from_dirs([runs]))
    assert len(wide) == 1  # one row: the systems stay side by side
    assert list(dict.fromkeys(s for s, _ in wide.columns)) == ["fiddler", "tide", "tide (migration=async)"]
    assert wide[("tide (migration=async)", "speedup")].tolist() == [6.0]


def test_long_csv_is_tidy(tmp_path: Path) -> None:
    second = base_result(tokens_per_s=200.0)
    ONE_SETTING["budget.gpu_gb"](second)
    runs = write_runs(tmp_path / "runs", [base_result(tokens_per_s=100.0), second, base_result("fiddler", 50.0)])
    out = tmp_path / "report"
    assert report.main(["--runs", str(runs), "--out", str(out)]) == 0
    with open(out / "report_long.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"model", "budget", "budget.gpu_gb", "system", "metric", "value", "source"} <= set(rows[0])
    cells = {(r["budget.gpu_gb"], r["system"], r["metric"]): float(r["value"]) for r in rows}
    assert len(cells) == len(rows)  # one value per (row key, system, metric)
    assert cells[("8.0", "tide", "tokens_per_s")] == 200.0 and cells[("12.0", "tide", "tokens_per_s")] == 100.0
    assert cells[("12.0", "tide", "speedup")] == 2.0 and ("8.0", "fiddler", "tokens_per_s") not in cells
    assert cells[("12.0", "fiddler", "miss_rate")] == 0.25
