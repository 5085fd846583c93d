"""A sweep's parent MLflow run: created (or reused on resume) by the launching process,
ended FINISHED by on_multirun_end (harness/cli/callbacks.py), and never left RUNNING by a
sweep that stops early.

A sweep that ends early never leaves its parent RUNNING: the launching process (the one
that runs Hydra's on_multirun_start, never a joblib worker or a SLURM job) holds a
`ParentRunGuard` until on_multirun_end. SIGTERM (`timeout`, SLURM, `kill`) raises
SystemExit(143) in its main thread, Ctrl-C raises KeyboardInterrupt as usual, and at
interpreter exit the guard ends the parent run KILLED (signal) or FAILED (an exception),
tagged `harness.ended=interrupted|failed` (`finished` after a complete sweep, plus
`harness.signal` after a signal), and ends KILLED and deletes any of its children still
RUNNING: a child run whose logging a second Ctrl-C cut short (the first one waits until
the run is logged: `deferred_interrupts`), like any half-logged run (the job's result.json
stays, without an `mlflow.json` marker). SIGKILL (or a lost node)
cannot be caught: the parent then stays RUNNING until the sweep is resumed (below), or
until `python -m harness.tracking push` (which logs the missing children but leaves the
parent's status alone).

`resume=true` in the same sweep dir (hydra.sweep.dir=...) whose parent run never
finished (KILLED, FAILED, or RUNNING after SIGKILL) reuses that parent: it is set back
to RUNNING (tag `harness.resumes` counts the resumes), orphaned RUNNING children are
discarded, results in the sweep dir that never reached the store are logged as its
children at the end of the sweep, and it ends FINISHED with the new summary, so the
whole grid sits under one parent. Its `sweep` param keeps the first command line. In
any other case a sweep gets a new parent; one left RUNNING by a dead sweep in the same
dir is first ended KILLED with `harness.ended=abandoned`. A sweep resumed into a new dir
ends the RUNNING parents of the sweeps whose results it reused KILLED, with
`harness.ended=superseded` (`end_superseded_parents`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import platform
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.common.files import read_json
from harness.results.records import workload_of
from harness.results.run_result import param_value
from harness.tracking.mlflow_store import (
    add_marker,
    default_artifact_root,
    discard_run,
    ensure_experiment,
    normalize_uri,
    open_store,
    warn_failure,
)
from harness.tracking.mlflow_ui import (
    NOTE_TAG,
    dataset_input,
    distinct_workloads,
    parent_description,
    parent_run_name,
    sweep_command,
    swept_keys,
    swept_overrides,
)
from harness.tracking.mlflow_view import ensure_results_view, swept_params
from harness.tracking.run_files import (
    PARENT_MARKER,
    RESULT_FILE,
    experiment_name,
    git_commit,
    parent_run_id,
    result_dirs,
    sweep_dir_of,
)
from harness.tracking.settings import TrackingConfig

FIGURE_SUFFIXES = (".png", ".pdf", ".svg")  # harness/report/plots.py writes each figure in all three
ENDED_TAG = "harness.ended"  # finished | interrupted | failed | abandoned | superseded (parent runs)
RESUMES_TAG = "harness.resumes"


def start_parent_run(tracking: TrackingConfig, sweep_dir: Path, models: set[str], overrides: list[str],
                     name: str | None = None, description: str | None = None,
                     swept: list[str] | None = None) -> str:
    """Create a sweep's parent run and record its id in the sweep dir; raises on failure.
    Its name says what the sweep varies and when it started, its description (markdown)
    holds the command (defaults: from the overrides, now); the experiment's saved view gets
    a column for each param the sweep varies (`swept`, default: the overrides' sweeps)."""
    client = open_store(tracking.uri, tracking.timeout_s)
    root = default_artifact_root(tracking.uri, tracking.artifact_root)
    experiment_id = ensure_experiment(client, experiment_name(tracking, models), root)
    swept = swept_overrides(overrides) if swept is None else swept
    with contextlib.suppress(Exception):  # the columns are a convenience; the sweep goes on without them
        ensure_results_view(client, experiment_id, swept_params(swept))
    tags = {"harness.kind": "sweep", "sweep_dir": str(sweep_dir.resolve()), "git_commit": git_commit(),
            "machine": platform.node(),
            "mlflow.runName": name or parent_run_name(swept, datetime.now(), models),
            NOTE_TAG: description or parent_description(sweep_command(overrides))}
    run = client.create_run(experiment_id, run_name=tags["mlflow.runName"], tags=tags)
    client.log_param(run.info.run_id, "sweep", param_value(" ".join(overrides)))
    add_marker(sweep_dir / PARENT_MARKER, tracking.uri, run.info.run_id, experiment_id)
    return run.info.run_id


def _multirun_record(sweep_dir: Path) -> tuple[list[str], dict[str, Any], list[str]]:
    """(task overrides, sweeper grid, Hydra overrides) from the multirun.yaml Hydra wrote into
    the sweep dir when the sweep started."""
    hydra = OmegaConf.load(sweep_dir / "multirun.yaml").get("hydra") or {}
    recorded = hydra.get("overrides") or {}
    params = (hydra.get("sweeper") or {}).get("params")
    grid = dict(OmegaConf.to_container(params)) if params else {}
    return [str(o) for o in recorded.get("task") or []], grid, [str(o) for o in recorded.get("hydra") or []]


def recorded_sweep(sweep_dir: Path, models: set[str] | None = None) -> tuple[str, str]:
    """(parent run name, command) of a sweep that ran without a parent run, from its
    multirun.yaml (push of a sweep that never reached the store)."""
    overrides, grid, hydra = _multirun_record(sweep_dir)
    started = datetime.fromtimestamp((sweep_dir / "multirun.yaml").stat().st_mtime)
    return parent_run_name(swept_overrides(overrides, grid), started, models or ()), sweep_command(overrides, hydra)


def job_swept_values(run_dir: Path) -> dict[str, str]:
    """The values this job of a sweep takes for every key the sweep varies ({} outside a
    sweep, or when Hydra's records are missing), from the sweep's multirun.yaml and the job's
    .hydra/overrides.yaml: what its child run's name carries."""
    sweep_dir = sweep_dir_of(run_dir)
    try:
        overrides, grid, _ = _multirun_record(sweep_dir) if sweep_dir is not None else ([], {}, [])
        job = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml") if sweep_dir is not None else []
    except (OSError, ValueError):
        return {}
    values = dict(str(o).split("=", 1) for o in job if "=" in str(o))
    values = {k.lstrip("+~"): v for k, v in values.items()}
    return {k: values[k] for k in swept_keys(overrides, grid) if k in values}


def sweep_figures(sweep_dir: Path) -> list[Path]:
    """The figures the sweep's end drew into its dir (each as PNG, PDF and SVG)."""
    return sorted(p for p in sweep_dir.iterdir() if p.suffix in FIGURE_SUFFIXES and p.is_file())


def workloads_in(sweep_dir: Path) -> list[Mapping[str, Any]]:
    """The distinct workloads the sweep's jobs decoded (dataset inputs of its parent run)."""
    found = []
    for run_dir in result_dirs([sweep_dir]):
        try:
            found.append(workload_of(read_json(run_dir / RESULT_FILE)))
        except (OSError, ValueError):  # an unreadable result is reported by the summary table
            continue
    return distinct_workloads(found)


def open_parent_run(tracking: TrackingConfig, sweep_dir: Path, models: set[str], overrides: list[str],
                    resume: bool = False, name: str | None = None, description: str | None = None,
                    swept: list[str] | None = None) -> tuple[str, bool]:
    """The sweep's parent run: (run id, reused). With resume, an unfinished parent recorded in
    this sweep dir is reused (its name kept); otherwise a new one is started (module docstring)."""
    client = open_store(tracking.uri, tracking.timeout_s)
    previous = _previous_parent(client, sweep_dir, tracking.uri)
    if previous is not None and resume and previous.info.status != "FINISHED":
        run_id = previous.info.run_id
        client.update_run(run_id, status="RUNNING")
        if ENDED_TAG in previous.data.tags:
            client.delete_tag(run_id, ENDED_TAG)
        resumes = int(previous.data.tags.get(RESUMES_TAG, "0") or 0) + 1
        client.set_tag(run_id, RESUMES_TAG, str(resumes))
        discard_orphans(client, previous.info.experiment_id, run_id)
        return run_id, True
    if previous is not None and previous.info.status == "RUNNING":  # its process died without a word
        end_parent_run(tracking, previous.info.run_id, "KILLED", "abandoned")
    return start_parent_run(tracking, sweep_dir, models, overrides, name, description, swept), False


def discard_orphans(client: Any, experiment_id: str, parent_id: str) -> None:
    """End KILLED and delete the RUNNING children of a parent whose sweep is over: runs whose
    logging was cut short (a child run is created and finished within one log_result)."""
    orphans = client.search_runs([experiment_id],
                                 f"tags.`mlflow.parentRunId` = '{parent_id}' and attributes.status = 'RUNNING'")
    for orphan in orphans:
        discard_run(client, orphan.info.run_id, "KILLED")


def _previous_parent(client: Any, sweep_dir: Path, uri: str) -> Any:
    run_id = parent_run_id(sweep_dir, uri)
    if run_id is None:
        return None
    try:
        run = client.get_run(run_id)
    except Exception:  # a marker from a store that was since replaced
        return None
    return run if run.info.lifecycle_stage == "active" else None


def finish_parent_run(tracking: TrackingConfig, run_id: str, files: list[Path], metrics: dict[str, float],
                      description: str | None = None, workloads: Sequence[Mapping[str, Any]] = (),
                      tags: Mapping[str, str] | None = None) -> None:
    """Log the summary (artifacts: the figures under plots/, metrics, tags such as the best
    system, the description with its table, the workloads its jobs decoded as dataset
    inputs) and end the parent run FINISHED."""
    client = open_store(tracking.uri, tracking.timeout_s)
    for path in files:
        if path.is_file():
            client.log_artifact(run_id, str(path), "plots" if path.suffix in FIGURE_SUFFIXES else None)
    for key, value in metrics.items():
        client.log_metric(run_id, key, value)
    for key, value in (tags or {}).items():
        client.set_tag(run_id, key, value)
    if description:
        client.set_tag(run_id, NOTE_TAG, description)
    if workloads:  # the same dataset as the children, so the dataset filter keeps the parent too
        client.log_inputs(run_id, datasets=[dataset_input(w) for w in workloads])
    client.set_tag(run_id, ENDED_TAG, "finished")
    client.set_terminated(run_id, "FINISHED")


def end_superseded_parents(tracking: TrackingConfig, sweep_dir: Path, parent_id: str,
                           reused: Sequence[Path]) -> list[str]:
    """A sweep resumed into a new dir supersedes the sweeps whose results it reused: a parent
    run of theirs still RUNNING (its process was killed without a word) is ended KILLED,
    tagged `harness.ended=superseded` and `harness.superseded_by=<this parent>`. Returns the
    ids ended. (A sweep still running elsewhere whose finished results were reused would
    be ended too: resume a sweep only once its earlier attempt is dead.)"""
    client = open_store(tracking.uri, tracking.timeout_s)
    ended = []
    old_dirs = {d for d in (sweep_dir_of(Path(p).parent) for p in reused) if d is not None}
    for old_dir in sorted(old_dirs - {sweep_dir.resolve()}):
        run = _previous_parent(client, old_dir, tracking.uri)
        if run is None or run.info.status != "RUNNING" or run.info.run_id == parent_id:
            continue
        client.set_tag(run.info.run_id, "harness.superseded_by", parent_id)
        end_parent_run(tracking, run.info.run_id, "KILLED", "superseded")
        ended.append(run.info.run_id)
    return ended


def end_parent_run(tracking: TrackingConfig, run_id: str, status: str, why: str,
                   signal_name: str | None = None) -> None:
    """Terminate a parent run that did not reach the end of its sweep; raises on store failure."""
    client = open_store(tracking.uri, tracking.timeout_s)
    client.set_tag(run_id, ENDED_TAG, why)
    if signal_name:
        client.set_tag(run_id, "harness.signal", signal_name)
    client.set_terminated(run_id, status)
    discard_orphans(client, client.get_run(run_id).info.experiment_id, run_id)


class ParentRunGuard:
    """Ends a sweep's parent run if the launching process exits before on_multirun_end.

    At interpreter exit (atexit) the run is ended KILLED after SIGTERM/SIGINT, FAILED after
    anything else (an exception that stopped the sweep). In the main thread, SIGTERM and
    SIGINT are wrapped to record which arrived: SIGTERM then raises SystemExit(143), so that
    `finally` blocks and atexit run; SIGINT goes on to its previous handler (KeyboardInterrupt).
    After the first signal the previous handler is back, so a second one acts as it would
    without the guard. A signal that was ignored stays ignored. `release()` (after the
    sweep) restores the handlers and drops the atexit hook. Only the process that created
    the guard acts on it (a forked child inherits atexit hooks, not this sweep).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, tracking: TrackingConfig, run_id: str) -> None:
        self.tracking = dataclasses.replace(tracking, uri=normalize_uri(tracking.uri))  # the cwd may change
        self.run_id = run_id
        self.pid = os.getpid()
        self.signal_name: str | None = None
        self.previous: dict[int, Any] = {}
        self.active = True
        atexit.register(self.at_exit)
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there; atexit still ends the run FAILED
        for signum in self.SIGNALS:
            previous = signal.getsignal(signum)
            if previous in (signal.SIG_IGN, None):  # ignored (nohup, a background job), or not set from Python
                continue
            try:
                signal.signal(signum, self.on_signal)
            except (ValueError, OSError):
                continue
            self.previous[signum] = previous

    def on_signal(self, signum: int, frame: Any) -> None:
        previous = self.previous.pop(signum, signal.SIG_DFL)
        signal.signal(signum, previous)
        if os.getpid() != self.pid:  # a forked child: act as if the guard had never been there
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)
            return
        self.signal_name = signal.Signals(signum).name
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)

    def at_exit(self) -> None:
        if not self.active or os.getpid() != self.pid:
            return
        self.active = False
        interrupted = self.signal_name is not None or isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)
        status, why = ("KILLED", "interrupted") if interrupted else ("FAILED", "failed")
        try:
            end_parent_run(self.tracking, self.run_id, status, why, self.signal_name)
            if self.signal_name != "SIGINT":  # Ctrl-C: the entry point's one line says it (harness/__main__.py)
                print(f"MLflow parent run {self.run_id} ended {status} (sweep {why})", file=sys.stderr)
        except Exception as exc:
            warn_failure(self.tracking.uri, "end of the parent run", exc)

    def release(self) -> None:
        """The sweep reached its end: no action at exit, the previous signal handlers back."""
        self.active = False
        atexit.unregister(self.at_exit)
        for signum, previous in list(self.previous.items()):
            try:
                if signal.getsignal(signum) == self.on_signal:
                    signal.signal(signum, previous)
            except ValueError:  # not the main thread
                pass
        self.previous.clear()
