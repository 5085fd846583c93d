"""`harness.report(...)`: the report as a Python call (the command: harness/report/tables.py), and
`harness.results(...)`: the tidy frame of the same runs, one row per run (harness/report/frame.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from harness.common.errors import HarnessError, check_output_dir
from harness.report.frame import tidy_frame
from harness.report.keys import keyed_runs
from harness.report.tables import (
    check_report_uri,
    pivot,
    records_from_dirs,
    records_from_mlflow,
    with_speedups,
    write_report,
)

PROGRESS_BARS = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def report(runs: Sequence[str | Path] | str | Path | None = None, *, from_mlflow: str | None = None,
           experiments: Sequence[str] | None = None, out: str | Path = "outputs/report",
           quiet: bool = False) -> pd.DataFrame:
    """Write report.md, report.csv, report_long.csv and the figures into `out` from the runs
    under `runs` (run or sweep dirs; default outputs) or an MLflow store (`from_mlflow`), and
    return the wide table (rows: every differing setting; columns: (system, metric)). Same-key
    warnings go to stderr; bad input raises HarnessError."""
    out = check_output_dir(out, "out")
    with _silenced(quiet):
        records = _records("harness.report", runs, from_mlflow, experiments)
        text, figures = write_report(records, Path(out))
    if not quiet:
        print(text, end="")
        print(f"wrote {Path(out).resolve()}/report.md, report.csv, report_long.csv and {len(figures)} figure(s)",
              file=sys.stderr)
    return pivot(keyed_runs(records))


def results(runs: Sequence[str | Path] | str | Path | None = None, *, from_mlflow: str | None = None,
            experiments: Sequence[str] | None = None, quiet: bool = False) -> pd.DataFrame:
    """The tidy frame (harness/report/frame.py): one row per run the report keeps, a column per
    setting and per metric (units in `.attrs["units"]`), paths absolute. Reads what
    `report` reads and writes nothing; same-key warnings go to stderr (`quiet=True`: nothing
    printed, no progress bars; they stay in `.attrs["warnings"]`)."""
    with _silenced(quiet):
        records = _records("harness.results", runs, from_mlflow, experiments)
        keyed = keyed_runs(records)
        if not quiet:
            for line in keyed.warnings:
                print(line, file=sys.stderr)
    return tidy_frame(keyed, with_speedups(keyed.frame, keyed.keys)["speedup"])


def _records(who: str, runs: Sequence[str | Path] | str | Path | None, from_mlflow: str | None,
             experiments: Sequence[str] | None) -> list[dict[str, Any]]:
    if from_mlflow and runs:
        raise HarnessError(f"{who}: give runs= or from_mlflow=, not both")
    if from_mlflow:
        check_report_uri(from_mlflow)
        records = records_from_mlflow(from_mlflow, list(experiments) if experiments else None)
    else:
        roots = [Path(r) for r in ([runs] if isinstance(runs, str | Path) else (runs or ["outputs"]))]
        missing = [str(r) for r in roots if not r.exists()]
        if missing:
            raise HarnessError(f"{who}: no such directory: {', '.join(missing)}")
        records = records_from_dirs(roots)
    if not records:
        raise HarnessError(f"{who}: no runs found in {from_mlflow or runs or 'outputs'}")
    return records


@contextlib.contextmanager
def _silenced(quiet: bool) -> Iterator[None]:
    """Nothing on stdout or stderr while reading (quiet): MLflow's artifact progress bars off,
    its log lines held back, and any other print swallowed."""
    if not quiet:
        yield
        return
    logger = logging.getLogger("mlflow")
    level, bars = logger.level, os.environ.get(PROGRESS_BARS)
    os.environ[PROGRESS_BARS] = "false"
    logger.setLevel(logging.CRITICAL)
    try:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        logger.setLevel(level)
        if bars is None:
            os.environ.pop(PROGRESS_BARS, None)
        else:
            os.environ[PROGRESS_BARS] = bars
