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
import os
import platform
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.mlflow_store import (
    TrackingUnavailable,
    add_marker,
    default_artifact_root,
    discard_run,
    ensure_experiment,
    find_marker,
    log_batches,
    log_config_yaml,
    normalize_uri,
    open_store,
    warn_failure,
)
from harness.results import read_json

RUN_MARKER = "mlflow.json"
PARENT_MARKER = "mlflow_parent.json"
RESULT_FILE = "result.json"
DEFAULT_URI = "sqlite:///outputs/mlflow.db"
PARAM_MAX_CHARS = 500  # MLflow allows 6000; long values (prompt lists) are in the config.yaml artifact
STEP_SERIES_KEYS = ("miss_rate", "modeled_latency_s")
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class TrackingConfig:
    """Schema of the `tracking` config node."""

    enabled: bool = True
    uri: str = DEFAULT_URI  # sqlite:///path.db, http://host:5000, postgresql://..., ...
    experiment: str | None = None  # null: one experiment per model ("llada2-mini")
    artifact_root: str | None = None  # null: <store dir>/mlartifacts for sqlite, the server's default otherwise


# --------------------------------------------------------------------------- settings


def tracking_settings(cfg: Any) -> TrackingConfig:
    """TrackingConfig from a full run config (DictConfig or dict); defaults when absent."""
    node = _get(cfg, "tracking")
    if node is None:
        return TrackingConfig()
    if isinstance(node, TrackingConfig):
        return node
    return TrackingConfig(**{k: _get(node, k) for k in ("enabled", "uri", "experiment", "artifact_root")
                             if _get(node, k) is not None})


def _get(node: Any, key: str) -> Any:
    if isinstance(node, Mapping):
        return node.get(key)
    return getattr(node, key, None)


def experiment_name(tracking: TrackingConfig, models: set[str] | list[str]) -> str:
    """The configured experiment, else one per model; a sweep over models shares one."""
    if tracking.experiment:
        return tracking.experiment
    models = sorted(set(models))
    return f"llada2-{models[0]}" if len(models) == 1 else "llada2-sweeps"


def is_logged(run_dir: str | Path, uri: str) -> bool:
    return find_marker(Path(run_dir) / RUN_MARKER, uri) is not None


# --------------------------------------------------------------------------- what gets logged


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def param_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    if len(text) > PARAM_MAX_CHARS:
        return text[: PARAM_MAX_CHARS - 40] + f"... ({len(text)} chars, see config.yaml)"
    return text


def run_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The flattened resolved config; where it is logged is not part of what ran."""
    return {k: param_value(v) for k, v in flatten(config).items() if not k.startswith(("tracking.", "hydra."))}


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def series_points(result: Mapping[str, Any]) -> Iterator[tuple[str, float, int]]:
    """(name, value, step): per-step series by global step, tau curves by tau."""
    for point in result.get("step_series") or []:
        for key in STEP_SERIES_KEYS:
            if isinstance(point.get(key), int | float):
                yield f"step_{key}", float(point[key]), int(point["global_step"])
    for name, curve in (result.get("system_report") or {}).items():
        if not (isinstance(curve, list) and name.endswith("curve")):
            continue
        for i, item in enumerate(curve):
            if isinstance(item, int | float):
                yield name, float(item), i + 1  # list index i is tau = i + 1
            elif isinstance(item, Mapping) and "tau" in item:
                for key, value in item.items():
                    if key != "tau" and isinstance(value, int | float):
                        yield f"{name}.{key}", float(value), int(item["tau"])


@lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_tags(result: Mapping[str, Any], run_dir: Path, config_hash: str | None) -> dict[str, str]:
    config = result.get("config") or {}
    budget = (result.get("budget") or {}).get("name") or (config.get("budget") or {}).get("name")
    tags = {
        "harness.kind": "job",
        "system": result.get("system"), "model": result.get("model"), "weights": result.get("weights"),
        "timing": result.get("timing"), "hardware": result.get("hardware"),
        "decode_cache": result.get("decode_cache"), "budget": budget,
        "git_commit": git_commit(), "mlflow.source.git.commit": git_commit(),
        "machine": (result.get("versions") or {}).get("machine") or platform.node(),
        "run_dir": str(run_dir.resolve()), "config_hash": config_hash,
        "mlflow.runName": "-".join(str(x) for x in (result.get("system"), budget, result.get("model")) if x),
    }
    return {k: str(v) for k, v in tags.items() if v is not None}


def artifact_files(run_dir: Path) -> list[tuple[Path, str | None]]:
    """(file, artifact sub-directory): result, plots, routing traces, Hydra's own record."""
    files: list[tuple[Path, str | None]] = [(run_dir / RESULT_FILE, None)]
    files += [(p, "plots") for p in sorted(run_dir.glob("*.png"))]
    files += [(p, "trace") for p in sorted(run_dir.glob("*.npz"))]
    files += [(p, "hydra") for p in sorted((run_dir / ".hydra").glob("*.yaml"))]
    return [(p, sub) for p, sub in files if p.is_file()]


# --------------------------------------------------------------------------- runs


def log_result(result: Mapping[str, Any], run_dir: str | Path, tracking: TrackingConfig,
               parent_run_id: str | None = None, config_hash: str | None = None) -> str:
    """Log one result as an MLflow run and mark the run dir; raises on any store failure."""
    run_dir = Path(run_dir)
    client = open_store(tracking.uri)
    if parent_run_id:  # children live in their parent's experiment, or the UI cannot nest them
        experiment_id = client.get_run(parent_run_id).info.experiment_id
    else:
        name = experiment_name(tracking, [str(result.get("model"))])
        experiment_id = ensure_experiment(client, name, default_artifact_root(tracking.uri, tracking.artifact_root))
    tags = run_tags(result, run_dir, config_hash)
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    # tagged from birth, so that a run cut short anywhere is found as its parent's orphan
    run = client.create_run(experiment_id, run_name=tags.get("mlflow.runName"), tags=tags)
    run_id = run.info.run_id
    try:
        metrics = [(k, v, 0) for k, v in numeric_metrics(result.get("metrics") or {}).items()]
        log_batches(client, run_id, run_params(result.get("config") or {}), {}, [*metrics, *series_points(result)])
        log_config_yaml(client, run_id, result.get("config") or {})
        for path, sub in artifact_files(run_dir):
            client.log_artifact(run_id, str(path), sub)
        client.set_terminated(run_id, "FINISHED")
    except BaseException as exc:  # a half-logged run would be duplicated by the next push
        discard_run(client, run_id, "FAILED" if isinstance(exc, Exception) else "KILLED")
        raise
    add_marker(run_dir / RUN_MARKER, tracking.uri, run_id, experiment_id)
    return run_id


def log_run(result: Mapping[str, Any], run_dir: str | Path, cfg: Any, parent_run_id: str | None = None) -> str | None:
    """Log a finished run; returns the MLflow run id, or None when disabled or on failure (warned)."""
    tracking = tracking_settings(cfg)
    if not tracking.enabled:
        return None
    from harness.resume import config_hash

    try:
        digest = config_hash(result.get("config") or {}, result.get("backend"))
        return log_result(result, run_dir, tracking, parent_run_id, digest)
    except Exception as exc:
        warn_failure(tracking.uri, "logging", exc, Path(run_dir))
        return None


def record_finished_run(result: Mapping[str, Any], run_dir: str | Path, cfg: Any) -> str | None:
    """After result.json: index it for resume, then log it (as a child inside a sweep)."""
    from harness.resume import config_dict, index_result

    try:
        index_result(result.get("config") or config_dict(cfg), run_dir, cfg.cache_dir, result.get("backend"))
    except OSError as exc:  # resume will rerun this job; the result itself is safe
        print(f"warning: resume index not written ({exc}); resume=true will rerun this job", file=sys.stderr)
    if not tracking_settings(cfg).enabled:
        return None
    from harness.cluster import job_leaves_logging_to_launcher

    if job_leaves_logging_to_launcher(tracking_settings(cfg).uri):  # no SQLite writes from compute nodes
        print("MLflow: this SLURM job's result is logged by the launching process at the end of the sweep")
        return None
    return log_run(result, run_dir, cfg, job_parent_run_id(cfg))


def parent_run_id(sweep_dir: str | Path, uri: str) -> str | None:
    marker = find_marker(Path(sweep_dir) / PARENT_MARKER, uri)
    return marker["run_id"] if marker else None


def job_parent_run_id(cfg: Any) -> str | None:
    """The parent run of the sweep this job belongs to (None for a single run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return parent_run_id(HydraConfig.get().sweep.dir, tracking_settings(cfg).uri)


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
    from harness.sweep_run import finish_parent_run, start_parent_run

    models = {str(read_json(d / RESULT_FILE).get("model")) for d in result_dirs([sweep_dir])}
    run_id = start_parent_run(tracking, sweep_dir, models or {"unknown"}, [f"(pushed from {sweep_dir})"])
    finish_parent_run(tracking, run_id, [sweep_dir / f for f in SWEEP_FILES], {})
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
            result = read_json(run_dir / RESULT_FILE)
            sweep = sweep_dir_of(run_dir)
            parent = push_parent(tracking, sweep) if sweep is not None else None
            digest = config_hash(result.get("config") or {}, result.get("backend"))
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
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        print(f"error: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    logged, present, failed = push(args.dirs, TrackingConfig(uri=args.uri, experiment=args.experiment))
    print(f"push to {normalize_uri(args.uri)}: {logged} logged, {present} already there, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
