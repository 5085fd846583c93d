"""MLflow store plumbing for harness.tracking: opening a store so that failure is fast,
experiments, batched logging, and the markers that say which store a directory reached.

A marker file (`mlflow.json` in a run dir, `mlflow_parent.json` in a sweep dir) holds one
entry per tracking URI: {"uri", "run_id", "experiment_id", "logged_at"}. sqlite URIs are
made absolute first, so the same store compares equal from any working directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from harness.results import read_json, write_json_atomic

BATCH_METRICS = 1000  # MLflow's per-call limits
BATCH_PARAMS = 100


class TrackingUnavailable(RuntimeError):
    """The store cannot be used right now; the caller warns and carries on."""


def normalize_uri(uri: str) -> str:
    """Absolute sqlite paths, so markers compare equal whatever the working directory."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


# --------------------------------------------------------------------------- markers


def read_markers(path: Path) -> list[dict[str, Any]]:
    try:
        return list(read_json(path).get("runs", []))
    except (OSError, ValueError, AttributeError):
        return []


def find_marker(path: Path, uri: str) -> dict[str, Any] | None:
    uri = normalize_uri(uri)
    return next((m for m in read_markers(path) if m.get("uri") == uri), None)


def add_marker(path: Path, uri: str, run_id: str, experiment_id: str) -> None:
    uri = normalize_uri(uri)
    runs = [m for m in read_markers(path) if m.get("uri") != uri]
    runs.append({"uri": uri, "run_id": run_id, "experiment_id": experiment_id, "logged_at": time.time()})
    write_json_atomic(path, {"runs": runs})


def _quiet_store_logs() -> None:
    # the first use of a sqlite store runs migrations that log at INFO through Hydra's handlers
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.store.sqlalchemy_store"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _probe_http(uri: str, timeout_s: float = 3.0) -> None:
    """Fail in seconds, not after MLflow's minutes of retries, when no server listens."""
    parsed = urlparse(uri)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "localhost", port), timeout=timeout_s).close()
    except OSError as exc:
        raise TrackingUnavailable(f"cannot reach {parsed.hostname}:{port} ({exc.strerror or exc})") from None


def open_store(uri: str) -> Any:
    """An MlflowClient for `uri`, after the checks that make failure fast."""
    uri = normalize_uri(uri)
    if uri.startswith(("http://", "https://")):
        _probe_http(uri)
        # a server that dies mid-run should cost seconds, not MLflow's default retry budget
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    elif uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    _quiet_store_logs()
    # MLflow's telemetry thread pops an environment variable when it cannot reach its (outside)
    # endpoint, racing with `requests` reading os.environ: a KeyError that drops a run's logging
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def default_artifact_root(uri: str, artifact_root: str | None = None) -> str | None:
    """Where new experiments keep artifacts: next to a sqlite file (not in the cwd's ./mlruns)."""
    if artifact_root:
        return artifact_root
    uri = normalize_uri(uri)
    if uri.startswith("sqlite:///"):
        return str(Path(uri[len("sqlite:///"):]).parent / "mlartifacts")
    return None  # a server decides (mlflow server --artifacts-destination)


def ensure_experiment(client: Any, name: str, artifact_root: str | None) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = Path(artifact_root, name).resolve().as_uri() if artifact_root and "://" not in artifact_root \
        else (f"{artifact_root.rstrip('/')}/{name}" if artifact_root else None)
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another process created it first (parallel jobs)
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def log_batches(client: Any, run_id: str, params: dict[str, str], tags: dict[str, str],
                 metrics: list[tuple[str, float, int]]) -> None:
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    items = list(params.items())
    for i in range(0, len(items), BATCH_PARAMS):
        client.log_batch(run_id, params=[Param(k, v) for k, v in items[i : i + BATCH_PARAMS]])
    tag_items = list(tags.items())
    for i in range(0, len(tag_items), BATCH_PARAMS):
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tag_items[i : i + BATCH_PARAMS]])
    points = [Metric(k, v, now, step) for k, v, step in metrics]
    for i in range(0, len(points), BATCH_METRICS):
        client.log_batch(run_id, metrics=points[i : i + BATCH_METRICS])


def log_config_yaml(client: Any, run_id: str, config: Mapping[str, Any]) -> None:
    from omegaconf import OmegaConf

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "config.yaml")
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(dict(config))))
        client.log_artifact(run_id, str(path))


def warn_failure(uri: str, what: str, exc: BaseException, run_dir: Path | None = None) -> None:
    reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    later = f"; result.json is kept in {run_dir}, log it later with: python -m harness.tracking push {run_dir} " \
            f"--uri {uri}" if run_dir is not None else ""
    print(f"warning: MLflow {what} skipped ({uri}): {reason}{later}", file=sys.stderr)


def discard_run(client: Any, run_id: str, status: str = "FAILED") -> None:
    """End (FAILED, or KILLED after a signal) and delete a half-logged run."""
    # the store may already be failing; the warning about the first error is enough
    with contextlib.suppress(Exception):
        client.set_terminated(run_id, status)
    with contextlib.suppress(Exception):
        client.delete_run(run_id)
