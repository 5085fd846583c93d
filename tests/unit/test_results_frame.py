"""`harness.results(...)` (harness/report/frame.py): one row per run the report keeps, flat
columns (every setting, every metric, units from the result schema), absolute paths, and
nothing printed under quiet=True; pivoted, it is the report's own table."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

import harness
from harness.report import tables
from tests.unit.test_report_keys import ONE_SETTING, write_runs
from tests.unit.test_report_sections import replay


def runs(root: Path) -> Path:
    """A 10GB cell (tide, fiddler) and the same at decode.threshold=0.9, and tide twice."""
    changed = [replay(tokens_per_s=40.0), replay("fiddler", tokens_per_s=20.0)]
    for run in changed:
        ONE_SETTING["decode.threshold"](run)
    return write_runs(root, [replay(tokens_per_s=15.0), replay(tokens_per_s=20.0),
                             replay("fiddler", tokens_per_s=10.0), *changed])


def test_one_row_per_kept_run_with_flat_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capfd: pytest.CaptureFixture) -> None:
    runs(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    df = harness.results("runs", quiet=True)
    assert capfd.readouterr() == ("", "")  # quiet: nothing at all, the same-key warning included
    assert len(df) == 4 and len(df.attrs["warnings"]) == 1 and "run0" in df.attrs["warnings"][0]
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in df["run"])
    assert not any(isinstance(c, tuple) for c in df.columns) and df.index.equals(pd.RangeIndex(4))
    assert {"decode.threshold", "weights", "workload", "system.tau", "budget.gpu_gb"} <= set(df.columns)
    assert {"tokens_per_s", "speedup", "miss_rate", "modeled_time_s", "expert_hit_rate"} <= set(df.columns)
    units = df.attrs["units"]
    assert (units["tokens_per_s"], units["miss_rate"], units["modeled_time_s"], units["speedup"]) == (
        "tokens/s", "fraction", "s (modeled)", "x")
    assert "decode.threshold" not in units and df.attrs["keys"][-1] == "decode.threshold"
    tide = df[(df["system"] == "tide") & (df["decode.threshold"] == "0.95")]
    assert tide["tokens_per_s"].tolist() == [20.0] and tide["speedup"].tolist() == [2.0]  # the newer run
    assert harness.results("runs").shape == df.shape  # not quiet: the warning goes to stderr
    assert capfd.readouterr().err.startswith("warning: 2 runs with the same settings")


def test_pivoted_it_is_the_report_table(tmp_path: Path) -> None:
    root = runs(tmp_path)
    df = harness.results(root, quiet=True)
    paper = df.pivot_table(index=df.attrs["keys"], columns="system", values=["tokens_per_s", "speedup"])
    wide = tables.paper_table(tables.records_from_dirs([root]))
    for system in ("tide", "fiddler"):
        for metric in ("tokens_per_s", "speedup"):
            ours = paper[(metric, system)].sort_index().tolist()
            theirs = wide[(system, metric)].sort_index().tolist()
            assert [x for x in ours if not math.isnan(x)] == [x for x in theirs if not math.isnan(x)]
