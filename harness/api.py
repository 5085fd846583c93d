"""The Python API: `harness.run`, `harness.sweep` (and `harness.report`, harness/report/api.py).

    import harness
    result = harness.run(["model=tiny", "system=tide", "budget=10GB"])   # -> RunResult
    result.flat_metrics()["tokens_per_s"], result.run_dir
    results = harness.sweep(["system=tide,fiddler", "budget=10GB,18GB"]) # -> list[RunResult]
    table = harness.report(runs=["outputs/multirun"])                     # -> the wide table
    frame = harness.results(runs=["outputs/multirun"])                    # -> one row per run

The overrides are the command line's (docs/python-api.md). A run composes and checks them
as the command line does (bad input raises HarnessError with the same one-line message),
runs in this process, writes result.json into its run dir and logs it to MLflow (resume
index too) exactly as `python -m harness` does. A sweep is Hydra's multirun, so it runs
`python -m harness -m ...` in a subprocess (Hydra's launchers, the parent run and the
summary come with it) and returns the results of its jobs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from harness.cli.hints import refuse_schema_options, refuse_sweep_without_multirun
from harness.cli.overrides import compose_with_hints, override_variants, user_overrides
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.job.mlflow_log import log_if_missing, record_finished_run, where_lines
from harness.job.resume import resumed_result_path, skip_if_done
from harness.results.run_result import RunResult
from harness.tracking.run_files import RESULT_FILE

REPO = Path(__file__).resolve().parent.parent


def _checked(overrides: Sequence[str], multirun: bool) -> list[str]:
    """The overrides as the command line checks them (hints, schema options, sweeps)."""
    given = [str(o) for o in overrides]
    kept = user_overrides(given) or []
    refuse_schema_options(kept)
    if not multirun:
        refuse_sweep_without_multirun([], kept)
    return given


def default_run_dir(now: datetime | None = None) -> Path:
    """outputs/runs/<date>_<time>: the command line's run dir, to the microsecond (two runs of
    one Python session never share one)."""
    return Path("outputs/runs") / f"{(now or datetime.now()):%Y-%m-%d_%H-%M-%S-%f}_api"


def run(overrides: Sequence[str] = (), run_dir: str | Path | None = None, quiet: bool = False) -> RunResult:
    """One job, as `python -m harness <overrides>` runs it; returns its RunResult, whose
    `run_dir` says where result.json went. Raises HarnessError on bad input (one line)."""
    register_configs()
    cfg = compose_with_hints(_checked(overrides, multirun=False))
    where = (Path(run_dir) if run_dir is not None else default_run_dir()).resolve()  # printed absolute too
    if skip_if_done(cfg, where):  # resume=true and this config already has a result: that one
        prior = resumed_result_path(where)
        if prior is None:
            raise HarnessError(f"resume=true found a result for this config but not its file in {where}")
        log_if_missing(prior, cfg)  # killed before logging: log it now
        result = RunResult.from_json(prior)
        result.run_dir = prior.parent
        return result
    result = run_job(cfg, where)
    run_id = record_finished_run(result, where, cfg)  # resume index + MLflow; never raises
    result.run_dir = where
    if not quiet:
        for line in [*result.summary_lines(cfg.show_text, cfg.show_wall), *where_lines(where, cfg, run_id)]:
            print(line)
    return result


def sweep(overrides: Sequence[str], sweep_dir: str | Path | None = None, quiet: bool = False) -> list[RunResult]:
    """A sweep, as `python -m harness -m <overrides>` runs it (in a subprocess: Hydra's
    multirun); returns the RunResult of every job that finished, in job order. Raises
    HarnessError when an override is bad or a job failed (the sweep's own message)."""
    register_configs()
    given = _checked(overrides, multirun=True)
    for variant in override_variants(user_overrides(given) or []):
        compose_with_hints(variant)  # a typo fails here, before anything starts
    where = (Path(sweep_dir) if sweep_dir is not None else
             Path("outputs/multirun") / f"{datetime.now():%Y-%m-%d_%H-%M-%S-%f}_api").resolve()
    command = [sys.executable, "-m", "harness", "-m", *given, f"hydra.sweep.dir={where.resolve()}"]
    proc = subprocess.run(command, capture_output=quiet, text=True, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or "").strip().splitlines()[-1:] if quiet else []
        raise HarnessError(f"the sweep exited {proc.returncode} ({where}){': ' + detail[0] if detail else ''}")
    results = []
    for job in sorted((p for p in where.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        path = job / RESULT_FILE if (job / RESULT_FILE).is_file() else resumed_result_path(job)
        if path is not None:
            result = RunResult.from_json(path)
            result.run_dir = job
            results.append(result)
    return results
