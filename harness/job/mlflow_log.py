"""MLflow tracking: one MLflow run per result.json, a parent run per sweep, and a push
command for results that never reached MLflow.

`result.json` is always written before anything here runs, and nothing here raises into
a run: an unreachable server or a locked or broken store costs one warning line on
stderr. A run directory that reached a store gets a marker (`mlflow.json`, one entry per
tracking URI), so `python -m harness.tracking push [DIR ...]` logs exactly the results
that are missing from a store. A sweep directory holds the same kind of marker for its
parent run (`mlflow_parent.json`); jobs read it to link themselves as children, which
works whatever process (joblib worker, SLURM node) runs them.

How a sweep's parent run starts, ends and resumes: harness/tracking/sweep_run.py.

MLflow is imported lazily: a run with `tracking.enabled=false` never pays for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from harness.common.errors import HarnessError, OneLineParser
from harness.common.interrupts import deferred_interrupts, end_startup, raise_if_interrupted
from harness.common.keyvalue import as_flags, program_name
from harness.common.paths import require_regular_file
from harness.job.resume import config_hash, index_result
from harness.results.records import SWEEP_FILES, workload_of
from harness.results.run_result import MlflowRecord, RunResult
from harness.tracking.cluster import job_leaves_logging_to_launcher
from harness.tracking.mlflow_store import (
    TrackingUnavailable,
    add_marker,
    default_artifact_root,
    discard_run,
    ensure_experiment,
    file_digest,
    find_marker,
    log_batches,
    log_config_yaml,
    normalize_uri,
    open_store,
    warn_failure,
)
from harness.tracking.mlflow_ui import (
    NOTE_TAG,
    child_description,
    child_run_name,
    dataset_input,
    parent_description,
    run_page_link,
)
from harness.tracking.run_files import (
    RESULT_FILE,
    RUN_MARKER,
    experiment_name,
    git_commit,
    parent_run_id,
    result_dirs,
    sweep_dir_of,
)
from harness.tracking.settings import DEFAULT_URI, TrackingConfig
from harness.tracking.sweep_run import (
    finish_parent_run,
    job_swept_values,
    recorded_sweep,
    start_parent_run,
    sweep_figures,
    workloads_in,
)
from harness.tracking.uris import check_store_is_mlflow, check_tracking_uri

if TYPE_CHECKING:
    from harness.job.config import HarnessConfig


# --------------------------------------------------------------------------- settings


def is_logged(run_dir: str | Path, uri: str) -> bool:
    """This store holds the run dir's result.json as it is now: its marker names the store
    and the digest of the result it logged (markers written before digests name none)."""
    marker = find_marker(Path(run_dir) / RUN_MARKER, uri)
    if marker is None:
        return False
    logged = marker.get("result_digest")
    return logged is None or logged == file_digest(Path(run_dir) / RESULT_FILE)


# --------------------------------------------------------------------------- what gets logged


def artifact_files(run_dir: Path) -> list[tuple[Path, str | None]]:
    """(file, artifact sub-directory): result, plots, routing traces, Hydra's own record."""
    files: list[tuple[Path, str | None]] = [(run_dir / RESULT_FILE, None)]
    files += [(p, "plots") for p in sorted(run_dir.glob("*.png"))]
    files += [(p, "trace") for p in sorted(run_dir.glob("*.npz"))]
    files += [(p, "hydra") for p in sorted((run_dir / ".hydra").glob("*.yaml"))]
    return [(p, sub) for p, sub in files if p.is_file()]


# --------------------------------------------------------------------------- runs


def log_result(result: RunResult, run_dir: str | Path, tracking: TrackingConfig,
               parent_run_id: str | None = None, config_hash: str | None = None) -> str:
    """Log one result as an MLflow run and mark the run dir; raises on any store failure.
    Ctrl-C or SIGTERM during the logging acts once the run is logged (a second Ctrl-C at once)."""
    run_dir = Path(run_dir)
    record = result.to_mlflow(run_dir, config_hash, git_commit())
    digest = file_digest(run_dir / RESULT_FILE)  # before logging: the marker names what was logged
    with deferred_interrupts():
        return _log_record(result, run_dir, tracking, parent_run_id, record, digest)


def _log_record(result: RunResult, run_dir: Path, tracking: TrackingConfig, parent_run_id: str | None,
                record: MlflowRecord, digest: str | None) -> str:
    client = open_store(tracking.uri, tracking.timeout_s)
    if parent_run_id:  # children live in their parent's experiment, or the UI cannot nest them
        experiment_id = client.get_run(parent_run_id).info.experiment_id
    else:
        name = experiment_name(tracking, [str(result.identity.model)])
        experiment_id = ensure_experiment(client, name, default_artifact_root(tracking.uri, tracking.artifact_root))
    tags = dict(record.tags)
    plain = result.to_dict()
    workload = workload_of(plain)
    tags[NOTE_TAG] = child_description({**plain, "workload": workload})
    ident = result.identity
    tags["mlflow.runName"] = child_run_name(ident.system, result.budget_name, ident.model, job_swept_values(run_dir))
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    start_ms, end_ms = job_times_ms(result)
    # tagged from birth, so that a run cut short anywhere is found as its parent's orphan
    run = client.create_run(experiment_id, start_time=start_ms, run_name=tags["mlflow.runName"], tags=tags)
    run_id = run.info.run_id
    try:
        metrics = [(k, v, 0) for k, v in record.metrics.items()]
        log_batches(client, run_id, record.params, {}, [*metrics, *record.series])
        if workload is not None:
            client.log_inputs(run_id, datasets=[dataset_input(workload)])
        log_config_yaml(client, run_id, result.config)
        for path, sub in artifact_files(run_dir):
            client.log_artifact(run_id, str(path), sub)
        client.set_terminated(run_id, "FINISHED", end_time=end_ms)
    except BaseException as exc:  # a half-logged run would be duplicated by the next push
        discard_run(client, run_id, "FAILED" if isinstance(exc, Exception) else "KILLED")
        raise
    add_marker(run_dir / RUN_MARKER, tracking.uri, run_id, experiment_id, digest)
    return run_id


def job_times_ms(result: RunResult) -> tuple[int | None, int | None]:
    """The job's own start and end (ms), so that the UI's Duration column is the job's time,
    not the logging's; (None, None) for a result that did not record them (MLflow: now)."""
    if result.started_at is None or result.finished_at is None:
        return None, None
    return int(result.started_at * 1000), int(result.finished_at * 1000)


def log_run(result: RunResult, run_dir: str | Path, tracking: TrackingConfig,
            parent_run_id: str | None = None) -> str | None:
    """Log a finished run; returns the MLflow run id, or None when disabled or on failure (warned)."""
    if not tracking.enabled:
        return None

    try:
        digest = config_hash(result.config, result.identity.backend)
        return log_result(result, run_dir, tracking, parent_run_id, digest)
    except Exception as exc:
        raise_if_interrupted()  # Ctrl-C during logging, turned into another error on its way up: not a store failure
        warn_failure(tracking.uri, "logging", exc, Path(run_dir))
        return None


def record_finished_run(result: RunResult, run_dir: str | Path, cfg: HarnessConfig) -> str | None:
    """After result.json: index it for resume, then log it (as a child inside a sweep)."""

    try:
        index_result(result.config, run_dir, cfg.cache_dir, result.identity.backend)
    except OSError as exc:  # resume will rerun this job; the result itself is safe
        print(f"warning: resume index not written ({exc}); resume=true will rerun this job", file=sys.stderr)
    if not cfg.tracking.enabled:
        return None

    if job_leaves_logging_to_launcher(cfg.tracking.uri):  # no SQLite writes from compute nodes
        print("MLflow: this SLURM job's result is logged by the launching process at the end of the sweep")
        return None
    return log_run(result, run_dir, cfg.tracking, job_parent_run_id(cfg.tracking))


def where_lines(run_dir: str | Path, cfg: HarnessConfig, run_id: str | None) -> list[str]:
    """Where a finished single run went: its result.json and, once logged, its MLflow run page."""
    lines = [f"result: {(Path(run_dir) / RESULT_FILE).resolve()}"]
    marker = find_marker(Path(run_dir) / RUN_MARKER, cfg.tracking.uri) if run_id else None
    if marker is not None:
        uri = normalize_uri(cfg.tracking.uri)
        link = run_page_link(uri, str(marker["experiment_id"]), run_id)
        serve = "" if uri.startswith(("http://", "https://")) else f" (after: mlflow ui --backend-store-uri {uri})"
        lines.append(f"MLflow run: {link}{serve}")
    return lines


def log_if_missing(result_path: Path | None, cfg: HarnessConfig) -> str | None:
    """resume=true skipped a job: log the result it reuses if this store lacks it (a sweep
    killed after result.json but before logging), as a child of the current sweep."""
    tracking = cfg.tracking
    if result_path is None or not tracking.enabled or is_logged(result_path.parent, tracking.uri):
        return None
    try:
        result = RunResult.from_json(result_path)
    except (OSError, ValueError, HarnessError) as exc:
        warn_failure(tracking.uri, "logging of the reused result", exc, result_path.parent)
        return None
    return log_run(result, result_path.parent, tracking, job_parent_run_id(tracking))


def job_parent_run_id(tracking: TrackingConfig) -> str | None:
    """The parent run of the sweep this job belongs to (None for a single run)."""

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return parent_run_id(HydraConfig.get().sweep.dir, tracking.uri)


# --------------------------------------------------------------------------- push


def push_parent(tracking: TrackingConfig, sweep_dir: Path) -> str:
    """The sweep's parent run in this store, created (with its summary) if it never got there."""
    existing = parent_run_id(sweep_dir, tracking.uri)
    if existing:
        return existing

    models = {str(RunResult.from_json(d / RESULT_FILE).identity.model) for d in result_dirs([sweep_dir])}
    name, command = recorded_sweep(sweep_dir, models)
    pushed = f"(pushed from {sweep_dir})"
    run_id = start_parent_run(tracking, sweep_dir, models or {"unknown"}, [pushed], name,
                              parent_description(command, note=pushed))
    summary = sweep_dir / SWEEP_FILES[1]
    table = summary.read_text() if summary.is_file() else None
    finish_parent_run(tracking, run_id, [*(sweep_dir / f for f in SWEEP_FILES[:2]), *sweep_figures(sweep_dir)], {},
                      parent_description(command, table, pushed), workloads_in(sweep_dir))
    return run_id


def push(roots: list[Path], tracking: TrackingConfig) -> tuple[int, int, int]:
    """Log every result under roots that this store lacks: (logged, already there, failed)."""

    logged = present = failed = 0
    for run_dir in result_dirs(roots):
        if is_logged(run_dir, tracking.uri):
            present += 1
            continue
        try:
            result = RunResult.from_json(run_dir / RESULT_FILE)
            sweep = sweep_dir_of(run_dir)
            parent = push_parent(tracking, sweep) if sweep is not None else None
            digest = config_hash(result.config, result.identity.backend)
            run_id = log_result(result, run_dir, tracking, parent, digest)
            print(f"logged {run_dir} -> run {run_id}")
            logged += 1
        except TrackingUnavailable as exc:
            warn_failure(tracking.uri, "push", exc)
            return logged, present, failed + 1
        except Exception as exc:
            warn_failure(tracking.uri, f"push of {run_dir}", exc)
            failed += 1
    return logged, present, failed


PUSH_FLAGS = {"uri": "--uri", "experiment": "--experiment"}


def check_results_readable(roots: list[Path]) -> None:
    """Every result.json to push reads as a result: a damaged one is named before anything
    is logged, instead of a decoder message per file and exit code 1."""
    for run_dir in result_dirs(roots):
        require_regular_file(run_dir / RESULT_FILE, str(run_dir / RESULT_FILE), "move that run dir out of the "
                             "pushed dirs")  # a FIFO would block the read
        try:
            RunResult.from_json(run_dir / RESULT_FILE)
        except (OSError, ValueError, TypeError, KeyError, AttributeError, HarnessError) as exc:
            reason = " ".join(str(exc).split())[:120] or type(exc).__name__
            raise HarnessError(f"{run_dir / RESULT_FILE} is not a readable result ({reason}); fix it or move "
                               "that run dir out of the pushed dirs") from None


def main(argv: list[str] | None = None) -> int:
    end_startup()  # the imports are done: Ctrl-C is the command's own from here
    prog = program_name("python -m harness.tracking")
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0],
                           epilog="Arguments are key=value (uri=..., experiment=...), as every harness command takes "
                                  "them; the --flags are the same options.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("push", help="log results that never reached MLflow",
                       usage=f"{prog} push [DIR ...] [uri=URI] [experiment=NAME]")
    p.add_argument("dirs", nargs="*", type=Path, default=[Path("outputs")], help="run or sweep dirs (default: outputs)")
    p.add_argument("--uri", default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI), help="uri=URI: tracking URI")
    p.add_argument("--experiment", default=None, help="experiment=NAME: experiment name (default: llada2-<model>)")
    try:  # a mistyped key or value: one line with the closest option
        args = parser.parse_args(as_flags(sys.argv[1:] if argv is None else argv, PUSH_FLAGS, f"{prog} push"))
        check_tracking_uri(args.uri, "--uri")
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        print(f"error: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        check_store_is_mlflow(normalize_uri(args.uri), "--uri")
        check_results_readable(args.dirs)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logged, present, failed = push(args.dirs, TrackingConfig(uri=args.uri, experiment=args.experiment))
    print(f"push to {normalize_uri(args.uri)}: {logged} logged, {present} already there, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
