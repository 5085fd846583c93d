"""Hydra callback for sweeps (registered in conf/config.yaml under hydra.callbacks).

  on_multirun_start  (launching process) for submitit launchers, pin the cache dir and
                     tracking URI for the jobs (harness/tracking/cluster.py); create the sweep's parent MLflow run (or,
                     with resume=true, reuse the unfinished one of this sweep dir) and record
                     its id in <sweep dir>/mlflow_parent.json, where every job, in
                     whatever process or node runs it, finds it (harness.job.mlflow_log); from
                     here on a guard ends the parent KILLED or FAILED if the process exits
                     early (SIGTERM, Ctrl-C, an exception)
  on_job_end         (the job's process) one compact line per finished job
  on_multirun_end    (launching process) the sweep's summary table: printed, written to
                     the sweep dir (CSV, markdown, every figure the report draws for the
                     jobs) and logged to the parent run (artifacts, the best system as a
                     tag, and with the command in its description),
                     which is then closed FINISHED and the guard released; then the link
                     that opens the runs table in the MLflow UI

Hydra turns an exception in a callback into a warning; these methods also catch their
own store failures so that a sweep never stops because MLflow is unreachable.
"""

from __future__ import annotations

import math
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.common.files import read_json
from harness.job import mlflow_log as tracking
from harness.job.resume import RESUMED_FILE, resumed_result_path
from harness.report.plots import all_figures, figure_files
from harness.report.sweep import sweep_markdown, sweep_records, sweep_table
from harness.results.records import SWEEP_FILES, compact_line, record_from_result
from harness.results.run_result import RunResult
from harness.tracking import cluster, mlflow_ui, sweep_run
from harness.tracking.run_files import PARENT_MARKER

SUMMARY_CSV, SUMMARY_MD, THROUGHPUT_PNG = SWEEP_FILES  # throughput.png: one of the figures


FAILED_JOBS = 0  # set by the last sweep in this process; `python -m harness` then exits 2
SWEEP_DIR: Path | None = None  # the sweep under way in this process (Ctrl-C's line names it)


def swept_models(config: DictConfig) -> set[str]:
    """The model names a sweep will run (a `model=a,b` override lists several)."""
    overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        if ov.get_key_element() in ("model", "+model") and ov.is_sweep_override():
            return {str(v) for v in ov.sweep_string_iterator()}
    return {str(config.model.name)}


def sweep_dir(config: DictConfig) -> Path:
    return Path(str(config.hydra.sweep.dir))


def tracking_of(config: DictConfig) -> tracking.TrackingConfig:
    """The typed `tracking` part of the sweep's config."""
    return OmegaConf.to_object(config.tracking)


def sweeper_params(config: DictConfig) -> dict[str, Any]:
    """The grid an experiment config gives the sweeper (hydra.sweeper.params), if any."""
    params = config.hydra.sweeper.get("params")
    return dict(OmegaConf.to_container(params, resolve=False)) if params else {}


def experiment_of(directory: Path, uri: str) -> str:
    marker = tracking.find_marker(directory / PARENT_MARKER, uri)
    return str(marker["experiment_id"]) if marker else "?"


class SweepCallback(Callback):
    def __init__(self) -> None:
        self.parent_run_id: str | None = None  # created (or reused) by this process
        self.command = ""  # the sweep's command line, for the parent run's description
        self.reused = False
        self.guard: sweep_run.ParentRunGuard | None = None

    def __getstate__(self) -> dict[str, Any]:  # launchers pickle callbacks for their workers
        return {**self.__dict__, "guard": None}  # the guard belongs to the launching process

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global SWEEP_DIR
        directory = sweep_dir(config)
        directory.mkdir(parents=True, exist_ok=True)
        SWEEP_DIR = directory
        settings = tracking_of(config)
        cluster.prepare_sweep(config, settings.enabled, settings.uri)  # before the launcher submits anything
        if not settings.enabled:
            return
        overrides = [str(o) for o in config.hydra.overrides.task]
        self.command = mlflow_ui.sweep_command(overrides, [str(o) for o in config.hydra.overrides.hydra])
        try:
            swept, models = mlflow_ui.swept_overrides(overrides, sweeper_params(config)), swept_models(config)
            name = mlflow_ui.parent_run_name(swept, datetime.now(), models)
            run_id, self.reused = sweep_run.open_parent_run(settings, directory, models, overrides,
                                                           resume=bool(config.resume), name=name,
                                                           description=mlflow_ui.parent_description(self.command),
                                                           swept=swept)
        except Exception as exc:
            tracking.warn_failure(settings.uri, "parent run", exc)
            return
        self.parent_run_id = run_id
        self.guard = sweep_run.ParentRunGuard(settings, run_id)
        again = " (resumed)" if self.reused else ""
        print(f"sweep {directory}: MLflow parent run {run_id}{again} ({tracking.normalize_uri(settings.uri)})")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return  # a single run already printed its summary
        run_dir = Path(str(config.hydra.runtime.output_dir))
        label = f"#{config.hydra.job.num}"
        if (run_dir / "failed.json").is_file():  # a HarnessError, already printed as one line
            print(f"[failed] {label}: {read_json(run_dir / 'failed.json')['error']}", flush=True)
        elif job_return.status == JobStatus.FAILED:
            reason = " ".join(str(job_return._return_value).split())[:200]
            print(f"[failed] {label}: {type(job_return._return_value).__name__}: {reason}", flush=True)
        elif (run_dir / "result.json").is_file() and not skipped_by_resume(run_dir):
            record = record_from_result(RunResult.from_json(run_dir / "result.json"), str(run_dir))
            print(compact_line(record, label), flush=True)
        # a job skipped by resume printed its own line

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global FAILED_JOBS, SWEEP_DIR
        directory = sweep_dir(config)
        SWEEP_DIR = None
        records = sweep_records(directory)
        FAILED_JOBS = sum(r["status"] == "failed" for r in records)
        try:
            files = write_sweep_summary(directory, records) if records else []
            files += regime_map(config, directory)  # +experiment=routing_regimes: the map after its anchor jobs
        except OSError as exc:  # a full or read-only disk: the jobs' own results are already saved
            print(f"warning: the sweep summary was not written to {directory} ({exc.strerror or exc}); the jobs' "
                  "results are in their dirs: python -m harness.report --runs " + str(directory), file=sys.stderr)
            files, records = [], []
        if records and FAILED_JOBS:  # what went wrong, one line a job; the table is in its file
            print(f"sweep summary ({directory}): {len(records) - FAILED_JOBS} of {len(records)} jobs done, "
                  f"{FAILED_JOBS} failed; the table: {directory / SUMMARY_MD}")
            for line in failed_lines(directory):
                print(line)
        elif records:
            print(f"sweep summary ({directory}):")
            print((directory / SUMMARY_MD).read_text(), end="")
        if self.parent_run_id is None:
            return
        settings = tracking_of(config)
        table = (directory / SUMMARY_MD).read_text() if records else None
        note = "Resumed (`resume=true`): the table covers every attempt in this sweep dir." if self.reused else None
        try:
            # results of an interrupted attempt whose logging was cut short; SLURM jobs on SQLite log nothing
            if self.reused or cluster.launcher_logs_for_jobs(config.hydra, settings.uri):
                tracking.push([directory], settings)
            sweep_run.finish_parent_run(settings, self.parent_run_id, files, sweep_metrics(records),
                                        mlflow_ui.parent_description(self.command, table, note),
                                        sweep_run.workloads_in(directory), best_run_tags(records))
            if bool(config.resume):  # a resume in a new dir: the killed sweep's parent is over
                reused = [p for p in map(resumed_result_path, {f.parent for f in directory.rglob(RESUMED_FILE)}) if p]
                for old in sweep_run.end_superseded_parents(settings, directory, self.parent_run_id, reused):
                    print(f"MLflow parent run {old} of the sweep this one resumed ended KILLED (superseded)")
            print(mlflow_ui.ui_hint(tracking.normalize_uri(settings.uri), experiment_of(directory, settings.uri)))
        except Exception as exc:
            tracking.warn_failure(settings.uri, "sweep summary", exc)
        # not in a `finally`: a signal during the above leaves the guard to end the run KILLED
        if self.guard is not None:
            self.guard.release()
        self.parent_run_id, self.guard = None, None


def failed_lines(directory: Path) -> list[str]:
    """`[failed] #<job>: <its one-line error>` for every job of the sweep that failed, in job order."""
    def number(path: Path) -> tuple[int, str]:
        name = path.parent.name
        return (int(name), name) if name.isdigit() else (1 << 62, name)

    lines = []
    for marker in sorted(directory.glob("*/failed.json"), key=number):
        try:
            error = " ".join(str(read_json(marker).get("error", "")).split())
        except (OSError, ValueError, AttributeError):
            error = "failed (its failed.json is unreadable)"
        lines.append(f"[failed] #{marker.parent.name}: {error}")
    return lines


def regime_map(config: DictConfig, directory: Path) -> list[Path]:
    """The regime map's files (docs/routing-regimes.md) for a sweep of +experiment=routing_regimes:
    `python -m harness.regimes` into <sweep dir>/regime_map (its own process: it replays the
    whole grid in one), logged with the sweep's summary."""
    if "+experiment=routing_regimes" not in list(config.hydra.overrides.task):
        return []
    out = directory / "regime_map"
    done = subprocess.run([sys.executable, "-m", "harness.regimes", f"out={out}", "tracking=false"], check=False)
    if done.returncode != 0:
        print(f"warning: the regime map failed (exit {done.returncode}); rerun python -m harness.regimes out={out}",
              file=sys.stderr)
        return []
    return sorted(p for p in out.iterdir() if p.is_file())


def skipped_by_resume(run_dir: Path) -> bool:
    """resume=true skipped this job just now: its resumed.json is newer than the result.json that
    an earlier attempt of the same sweep dir left there (a job that ran writes result.json last)."""

    try:
        return (run_dir / RESUMED_FILE).stat().st_mtime_ns >= (run_dir / "result.json").stat().st_mtime_ns
    except OSError:
        return False


def write_sweep_summary(directory: Path, records: list[dict[str, Any]]) -> list[Path]:
    """The summary table (CSV, markdown) and every figure the report draws for these jobs
    (throughput.png, tau_sweep_*, miss_per_step_*; each also as PDF and SVG)."""
    table = sweep_table(records)
    table.to_csv(directory / SUMMARY_CSV, index=False)
    (directory / SUMMARY_MD).write_text(sweep_markdown(table))
    done = [r for r in records if r["status"] != "failed"]
    figures = all_figures(done, directory) if done else []
    return [directory / SUMMARY_CSV, directory / SUMMARY_MD, *(f for png in figures for f in figure_files(png))]


def best_run(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The job with the highest tokens/s (None when no job has a figure)."""
    ranked = [r for r in records if r["status"] != "failed" and not math.isnan(r["tokens_per_s"])]
    return max(ranked, key=lambda r: r["tokens_per_s"]) if ranked else None


def best_run_tags(records: list[dict[str, Any]]) -> dict[str, str]:
    """The parent's `best_system` tag: the fastest job by name (`tide system.tau=4 budget=10GB`)."""
    best = best_run(records)
    if best is None:
        return {}
    varies = best.get("overrides") or f"budget={best['budget']}"
    return {"best_system": f"{best['system']} ({varies}): {best['tokens_per_s']:.1f} tok/s ({best['timing']})"}


def sweep_metrics(records: list[dict[str, Any]]) -> dict[str, float]:
    count = {s: float(sum(r["status"] == s for r in records)) for s in ("ok", "skipped", "failed")}
    best = best_run(records)
    return {"jobs": float(len(records)), "jobs_ok": count["ok"], "jobs_skipped": count["skipped"],
            "jobs_failed": count["failed"], **({"best_tokens_per_s": best["tokens_per_s"]} if best else {})}
