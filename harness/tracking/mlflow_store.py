"""MLflow store plumbing for harness.job.mlflow_log: opening a store so that failure is fast,
experiments, batched logging, and the markers that say which store a directory reached.

A marker file (`mlflow.json` in a run dir, `mlflow_parent.json` in a sweep dir) holds one
entry per tracking URI: {"uri", "run_id", "experiment_id", "logged_at"}. sqlite URIs are
made absolute first, so the same store compares equal from any working directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import math
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.common.errors import HarnessError
from harness.common.files import read_json, write_json_atomic
from harness.tracking.mlflow_ui import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, experiment_tags
from harness.tracking.mlflow_view import ensure_results_view
from harness.tracking.uris import check_store_is_mlflow

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
    return next((m for m in read_markers(path) if isinstance(m, dict) and m.get("uri") == uri), None)


def add_marker(path: Path, uri: str, run_id: str, experiment_id: str, result_digest: str | None = None) -> None:
    """Record that `uri` holds run `run_id`; for a job, `result_digest` names the result.json
    it logged (file_digest), so a changed result is seen as not logged."""
    uri = normalize_uri(uri)
    runs = [m for m in read_markers(path) if isinstance(m, dict) and m.get("uri") != uri]
    entry = {"uri": uri, "run_id": run_id, "experiment_id": experiment_id, "logged_at": time.time()}
    if result_digest is not None:
        entry["result_digest"] = result_digest
    runs.append(entry)
    write_json_atomic(path, {"runs": runs})


def file_digest(path: Path) -> str | None:
    """sha256 of a file's bytes; None when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _quiet_store_logs() -> None:
    # the first use of a sqlite store runs migrations that log at INFO through Hydra's handlers;
    # urllib3 logs each retry against a server that does not answer (to stdout, through Hydra's)
    for name in ("alembic", "mlflow.store.sqlalchemy_store"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # a store that fails mid-run (unwritable, full): MLflow logs each failed statement with its
    # traceback (logger.exception) before raising; the harness's one warning line says it all
    for name in ("mlflow.store.db.utils", "mlflow.store.tracking.sqlalchemy_store", "sqlalchemy.pool"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for name in ("urllib3", "urllib3.connectionpool", "mlflow.utils.rest_utils"):
        logging.getLogger(name).setLevel(logging.ERROR)


DEFAULT_TIMEOUT_S = 5.0  # tracking.timeout_s: the longest one request to a tracking server may take
# set by the user before the harness ran: theirs win over tracking.timeout_s
_USER_HTTP_ENV = {k for k in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES") if k in os.environ}


def mlflow_environment(timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Before MLflow is imported: no telemetry (MLflow 3 otherwise writes an installation id
    under ~/.config/mlflow and sends usage events; MLFLOW_DISABLE_TELEMETRY, in
    mlflow/environment_variables.py, turns it off, and a user's own setting is kept), and
    HTTP requests that give up after `timeout_s` without retries (MLflow's defaults are a
    120 s timeout and 7 retries with backoff, minutes against a hung server)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    settings = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(timeout_s))),
                "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    for key, value in settings.items():
        if key not in _USER_HTTP_ENV:
            os.environ[key] = value


def _probe_http(uri: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Fail in seconds, not after MLflow's minutes of retries, when no server answers: one
    GET of the server's /health within `timeout_s`. Any HTTP answer (even 401 or 404 from a
    proxy) means something is there; no connection, or no answer in time, means not."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        return
    except http.client.HTTPException as exc:  # its message may hold the raw bytes: not for the terminal
        if isinstance(exc, ConnectionError):  # RemoteDisconnected: closed without a word
            raise TrackingUnavailable(f"no answer from {url} (the connection was closed)") from None
        raise TrackingUnavailable(f"{url} answered, but not with HTTP ({type(exc).__name__}); is it an MLflow "
                                  "server?") from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise TrackingUnavailable(f"no answer from {url} within {timeout_s:g} s ({reason})") from None


_INITIALISED: set[str] = set()  # sqlite stores this process has created or migrated


def _initialise_sqlite(uri: str) -> None:
    """Create (or migrate) a sqlite store once, under a file lock: MLflow's schema migration
    is not safe against a second process doing the same (two sweeps started together on a
    new store lost a parent run to "Online migration expected to match one row")."""
    if uri in _INITIALISED:
        return
    from filelock import FileLock, Timeout
    from mlflow import MlflowClient

    db = Path(uri[len("sqlite:///"):])
    try:
        check_store_is_mlflow(uri)  # before MLflow adds its tables to someone else's database
    except HarnessError as exc:
        raise TrackingUnavailable(str(exc)) from None
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(db) + ".lock", timeout=120):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # builds the schema
    except Timeout:
        raise TrackingUnavailable(f"{db}.lock held for 2 minutes by another process") from None
    _INITIALISED.add(uri)


def open_store(uri: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """An MlflowClient for `uri`, after the checks that make failure fast."""
    uri = normalize_uri(uri)
    mlflow_environment(timeout_s)
    _quiet_store_logs()
    # MLflow's telemetry thread pops an environment variable when it cannot reach its (outside)
    # endpoint, racing with `requests` reading os.environ: a KeyError that drops a run's logging
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if uri.startswith(("http://", "https://")):
        _probe_http(uri, timeout_s)
    elif uri.startswith("sqlite:///"):
        _initialise_sqlite(uri)
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
    """The experiment's id, created if missing, with the harness's experiment tags (the kind
    that opens the MLflow UI on the runs table, harness/tracking/mlflow_ui.py) and its saved
    view "Results" (harness/tracking/mlflow_view.py)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        declare_kind(client, found)
        experiment_id = found.experiment_id
    else:
        experiment_id = _create_experiment(client, name, artifact_root)
    with contextlib.suppress(Exception):  # a store that refuses experiment tags still takes the run
        ensure_results_view(client, experiment_id)
    return experiment_id


def _create_experiment(client: Any, name: str, artifact_root: str | None) -> str:
    location = Path(artifact_root, name).resolve().as_uri() if artifact_root and "://" not in artifact_root \
        else (f"{artifact_root.rstrip('/')}/{name}" if artifact_root else None)
    try:
        return client.create_experiment(name, artifact_location=location, tags=experiment_tags())
    except Exception:  # another process created it first (parallel jobs)
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def declare_kind(client: Any, experiment: Any) -> None:
    """Tag an experiment made before the harness declared its kind; a kind already set (by a
    user in the UI, say) is left as it is."""
    if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


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
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "config.yaml")
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(dict(config))))
        client.log_artifact(run_id, str(path))


def database_cause(exc: BaseException) -> BaseException | None:
    """The database's own error under SQLAlchemy's (and MLflow's) wrappers, whose text is
    mostly advice about sessions: "attempt to write a readonly database"."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        orig = getattr(seen, "orig", None)
        if isinstance(orig, BaseException):
            return orig
        seen = seen.__cause__ or seen.__context__
    return None


def warn_failure(uri: str, what: str, exc: BaseException, run_dir: Path | None = None) -> None:
    reason = " ".join(str(database_cause(exc) or exc).split())[:300] or type(exc).__name__
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
