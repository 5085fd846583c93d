"""`harness.report(...)`: the report as a Python call (the command: harness/report/tables.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from harness.common.errors import HarnessError, check_output_dir
from harness.report.keys import keyed_runs
from harness.report.tables import check_report_uri, pivot, records_from_dirs, records_from_mlflow, write_report


def report(runs: Sequence[str | Path] | str | Path | None = None, *, from_mlflow: str | None = None,
           experiments: Sequence[str] | None = None, out: str | Path = "outputs/report",
           quiet: bool = False) -> pd.DataFrame:
    """Write report.md, report.csv, report_long.csv and the figures into `out` from the runs
    under `runs` (run or sweep dirs; default outputs) or an MLflow store (`from_mlflow`), and
    return the wide table (rows: every differing setting; columns: (system, metric)). Same-key
    warnings go to stderr; bad input raises HarnessError."""
    if from_mlflow and runs:
        raise HarnessError("harness.report: give runs= or from_mlflow=, not both")
    out = check_output_dir(out, "out")
    if from_mlflow:
        check_report_uri(from_mlflow)
        records = records_from_mlflow(from_mlflow, list(experiments) if experiments else None)
    else:
        roots = [Path(r) for r in ([runs] if isinstance(runs, str | Path) else (runs or ["outputs"]))]
        missing = [str(r) for r in roots if not r.exists()]
        if missing:
            raise HarnessError(f"harness.report: no such directory: {', '.join(missing)}")
        records = records_from_dirs(roots)
    if not records:
        raise HarnessError(f"harness.report: no runs found in {from_mlflow or runs or 'outputs'}")
    text, figures = write_report(records, Path(out))
    if not quiet:
        print(text, end="")
        print(f"wrote {out}/report.md, report.csv, report_long.csv and {len(figures)} figure(s)", file=sys.stderr)
    return pivot(keyed_runs(records))
