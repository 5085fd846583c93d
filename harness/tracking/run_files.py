"""Where finished runs live on disk and what names them in MLflow: the run directory's
files and markers, the sweep a job belongs to, experiment names, the code's commit and a
result's workload record. A leaf below harness/job/mlflow_log.py (logging), harness/tracking/sweep_run.py
(parent runs) and harness/report/tables.py (tables), which all find runs the same way."""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

from harness.tracking.mlflow_store import find_marker
from harness.tracking.settings import TrackingConfig
from harness.zoo.entry import model_entry, model_names

RUN_MARKER = "mlflow.json"


PARENT_MARKER = "mlflow_parent.json"


RESULT_FILE = "result.json"


REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def experiment_name(tracking: TrackingConfig, models: set[str] | list[str]) -> str:
    """The configured experiment, else one per model, named by its entry's prefix
    (llada2-mini; a transformers family by its own name, qwen3_moe); a sweep over models
    shares one: <prefix>sweeps when they are one entry's, else moe-sweeps."""
    if tracking.experiment:
        return tracking.experiment
    models = sorted(set(models))
    kinds = {_entry_of(m) for m in models}
    if len(models) == 1:
        return f"{_prefix(models[0])}{models[0]}"
    prefix = _prefix(models[0]) if len(kinds) == 1 else ""
    return f"{prefix}sweeps" if prefix else "moe-sweeps"


def _entry_of(model: str) -> str:
    """The model's entry (a result's model no longer registered stands for itself)."""
    return model_entry(model).name if model in model_names() else model


def _prefix(model: str) -> str:
    return model_entry(model).experiment_prefix if model in model_names() else ""


@lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parent_run_id(sweep_dir: str | Path, uri: str) -> str | None:
    marker = find_marker(Path(sweep_dir) / PARENT_MARKER, uri)
    return marker["run_id"] if marker else None


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
