"""MLflow tracking: one MLflow run per result.json, a parent run per sweep, and a push
command for results that never reached MLflow.

`result.json` is always written before anything here runs, and nothing here raises into
a run: an unreachable server or a locked or broken store costs one warning line on
stderr. A run directory that reached a store gets a marker (`mlflow.json`, one entry per
tracking URI), so `python -m harness.tracking push [DIR ...]` logs exactly the results
that are missing from a store. A sweep directory holds the same kind of marker for its
parent run (`mlflow_parent.json`); jobs read it to link themselves as children, which
works whatever process (joblib worker, SLURM node) runs them.

How a sweep's parent run starts, ends and resumes: harness/sweep_run.py.

MLflow is imported lazily: a run with `tracking.enabled=false` never pays for it.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING

from harness.errors import HarnessError
from harness.mlflow_store import (
    DEFAULT_TIMEOUT_S,
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
from harness.mlflow_ui import NOTE_TAG, child_description, dataset_input, parent_description
from harness.result import PARAM_MAX_CHARS, RunResult  # noqa: F401 - PARAM_MAX_CHARS re-exported
from harness.uris import check_tracking_uri
from harness.workload import workload_record

if TYPE_CHECKING:
    from harness.config import HarnessConfig

RUN_MARKER = "mlflow.json"
PARENT_MARKER = "mlflow_parent.json"
RESULT_FILE = "result.json"
DEFAULT_URI = "sqlite:///outputs/mlflow.db"
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class TrackingConfig:
    """Schema of the `tracking` config node."""

    enabled: bool = True
    uri: str = DEFAULT_URI  # sqlite:///path.db, http://host:5000, postgresql://..., ...
    experiment: str | None = None  # null: one experiment per model ("llada2-mini")
    artifact_root: str | None = None  # null: <store dir>/mlartifacts for sqlite, the server's default otherwise
    timeout_s: float = DEFAULT_TIMEOUT_S  # the longest a request to a tracking server may take (no retries)

    def __post_init__(self) -> None:
        """The URI's form and the timeout, before the run (a bad scheme used to be reported after it)."""
        if self.enabled and self.uri != MISSING:
            check_tracking_uri(str(self.uri), "tracking.uri")
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= 600):
            raise HarnessError(f"tracking.timeout_s={self.timeout_s} must be a number of seconds in (0, 600]")


# --------------------------------------------------------------------------- settings


def experiment_name(tracking: TrackingConfig, models: set[str] | list[str]) -> str:
    """The configured experiment, else one per model; a sweep over models shares one."""
    if tracking.experiment:
        return tracking.experiment
    models = sorted(set(models))
    return f"llada2-{models[0]}" if len(models) == 1 else "llada2-sweeps"


def is_logged(run_dir: str | Path, uri: str) -> bool:
    """This store holds the run dir's result.json as it is now: its marker names the store
    and the digest of the result it logged (markers written before digests name none)."""
    marker = find_marker(Path(run_dir) / RUN_MARKER, uri)
    if marker is None:
        return False
    logged = marker.get("result_digest")
    return logged is None or logged == file_digest(Path(run_dir) / RESULT_FILE)


# --------------------------------------------------------------------------- what gets logged


@lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def workload_of(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The result's workload record; for a result.json written before runs recorded one, the
    record of a built-in prompt list in its config (a prompts file may have changed since)."""
    if result.get("workload"):
        return dict(result["workload"])
    config = result.get("config") or {}
    workload = config.get("workload") or {}
    prompts = [str(p) for p in workload.get("prompts") or []]
    if workload.get("path") or not prompts or source_is_trace_file(config):
        return None
    return workload_record(workload, prompts[: config.get("limit_prompts") or None])


def source_is_trace_file(config: Mapping[str, Any]) -> bool:
    """A replay of an explicit trace decoded the trace's prompts, not the configured ones."""
    return config.get("source") == "trace" and bool((config.get("trace") or {}).get("path"))


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
    """Log one result as an MLflow run and mark the run dir; raises on any store failure."""
    run_dir = Path(run_dir)
    record = result.to_mlflow(run_dir, config_hash, git_commit())
    digest = file_digest(run_dir / RESULT_FILE)  # before logging: the marker names what was logged
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
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    # tagged from birth, so that a run cut short anywhere is found as its parent's orphan
    run = client.create_run(experiment_id, run_name=tags.get("mlflow.runName"), tags=tags)
    run_id = run.info.run_id
    try:
        metrics = [(k, v, 0) for k, v in record.metrics.items()]
        log_batches(client, run_id, record.params, {}, [*metrics, *record.series])
        if workload is not None:
            client.log_inputs(run_id, datasets=[dataset_input(workload)])
        log_config_yaml(client, run_id, result.config)
        for path, sub in artifact_files(run_dir):
            client.log_artifact(run_id, str(path), sub)
        client.set_terminated(run_id, "FINISHED")
    except BaseException as exc:  # a half-logged run would be duplicated by the next push
        discard_run(client, run_id, "FAILED" if isinstance(exc, Exception) else "KILLED")
        raise
    add_marker(run_dir / RUN_MARKER, tracking.uri, run_id, experiment_id, digest)
    return run_id


def log_run(result: RunResult, run_dir: str | Path, tracking: TrackingConfig,
            parent_run_id: str | None = None) -> str | None:
    """Log a finished run; returns the MLflow run id, or None when disabled or on failure (warned)."""
    if not tracking.enabled:
        return None
    from harness.resume import config_hash

    try:
        digest = config_hash(result.config, result.identity.backend)
        return log_result(result, run_dir, tracking, parent_run_id, digest)
    except Exception as exc:
        warn_failure(tracking.uri, "logging", exc, Path(run_dir))
        return None


def record_finished_run(result: RunResult, run_dir: str | Path, cfg: HarnessConfig) -> str | None:
    """After result.json: index it for resume, then log it (as a child inside a sweep)."""
    from harness.resume import index_result

    try:
        index_result(result.config, run_dir, cfg.cache_dir, result.identity.backend)
    except OSError as exc:  # resume will rerun this job; the result itself is safe
        print(f"warning: resume index not written ({exc}); resume=true will rerun this job", file=sys.stderr)
    if not cfg.tracking.enabled:
        return None
    from harness.cluster import job_leaves_logging_to_launcher

    if job_leaves_logging_to_launcher(cfg.tracking.uri):  # no SQLite writes from compute nodes
        print("MLflow: this SLURM job's result is logged by the launching process at the end of the sweep")
        return None
    return log_run(result, run_dir, cfg.tracking, job_parent_run_id(cfg.tracking))


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


def parent_run_id(sweep_dir: str | Path, uri: str) -> str | None:
    marker = find_marker(Path(sweep_dir) / PARENT_MARKER, uri)
    return marker["run_id"] if marker else None


def job_parent_run_id(tracking: TrackingConfig) -> str | None:
    """The parent run of the sweep this job belongs to (None for a single run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return parent_run_id(HydraConfig.get().sweep.dir, tracking.uri)


# --------------------------------------------------------------------------- push


ARTIFACT_TREES = {"mlartifacts", "mlruns"}  # MLflow's copies of result.json are not runs


def find_files(roots: list[Path], name: str) -> list[Path]:
    """Files called `name` under the roots (or the roots themselves), outside artifact stores."""
    found = []
    for root in roots:
        paths = [root] if root.is_file() else [root / name] if (root / name).is_file() else root.rglob(name)
        found += [p.resolve() for p in paths if p.name == name and not ARTIFACT_TREES & set(p.resolve().parts)]
    return found


def result_dirs(roots: list[Path]) -> list[Path]:
    """Run directories (holding a result.json) under the roots, oldest first."""
    found = {p.parent for p in find_files(roots, RESULT_FILE)}
    return sorted(found, key=lambda d: ((d / RESULT_FILE).stat().st_mtime, str(d)))


def sweep_dir_of(run_dir: Path) -> Path | None:
    """The Hydra sweep directory a job directory belongs to (it holds multirun.yaml)."""
    for parent in run_dir.parents:
        if (parent / "multirun.yaml").is_file():
            return parent
        if parent == parent.parent:
            break
    return None


def push_parent(tracking: TrackingConfig, sweep_dir: Path) -> str:
    """The sweep's parent run in this store, created (with its summary) if it never got there."""
    existing = parent_run_id(sweep_dir, tracking.uri)
    if existing:
        return existing
    from harness.report import SWEEP_FILES
    from harness.sweep_run import finish_parent_run, recorded_sweep, start_parent_run, workloads_in

    models = {str(RunResult.from_json(d / RESULT_FILE).identity.model) for d in result_dirs([sweep_dir])}
    name, command = recorded_sweep(sweep_dir)
    pushed = f"(pushed from {sweep_dir})"
    run_id = start_parent_run(tracking, sweep_dir, models or {"unknown"}, [pushed], name,
                              parent_description(command, note=pushed))
    summary = sweep_dir / SWEEP_FILES[1]
    table = summary.read_text() if summary.is_file() else None
    finish_parent_run(tracking, run_id, [sweep_dir / f for f in SWEEP_FILES], {},
                      parent_description(command, table, pushed), workloads_in(sweep_dir))
    return run_id


def push(roots: list[Path], tracking: TrackingConfig) -> tuple[int, int, int]:
    """Log every result under roots that this store lacks: (logged, already there, failed)."""
    from harness.resume import config_hash

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tracking", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("push", help="log results that never reached MLflow")
    p.add_argument("dirs", nargs="*", type=Path, default=[Path("outputs")], help="run or sweep dirs (default: outputs)")
    p.add_argument("--uri", default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI), help="tracking URI")
    p.add_argument("--experiment", default=None, help="experiment name (default: llada2-<model>)")
    args = parser.parse_args(argv)
    from harness.errors import HarnessError
    from harness.uris import check_tracking_uri

    try:
        check_tracking_uri(args.uri, "--uri")
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        print(f"error: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    logged, present, failed = push(args.dirs, TrackingConfig(uri=args.uri, experiment=args.experiment))
    print(f"push to {normalize_uri(args.uri)}: {logged} logged, {present} already there, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
