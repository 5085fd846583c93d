"""Sweeps whose jobs run in other processes or on other machines (Hydra's submitit
launchers: `hydra/launcher=slurm`, `hydra/launcher=submitit_local`).

Such a job recomposes its config where it runs: the command line's overrides travel with
it, but `${oc.env:...}` defaults and relative paths are read on the compute node. So the
launching process pins the two locations every job must share, as absolute values, into
the environment that the jobs inherit (sbatch exports the submitting environment by
default; submitit's local executor copies it):

  HARNESS_CACHE          the cache dir (proxy weights, calibration, the resume index)
  HARNESS_TRACKING_URI   the tracking URI (conf/config.yaml reads it as the default)

A SQLite file is a poor store for jobs on several nodes (file locking over NFS/Lustre is
unreliable, and concurrent writers already lose runs on one machine). With the SLURM
launcher and a SQLite URI, the launching process therefore warns, the jobs keep their
result.json without touching the store, and the launching process logs them all, as one
writer, at the end of the sweep (`python -m harness.tracking push` does the same later if
it was killed). An `mlflow server` URI (docs/clusters.md) is logged to
from the jobs directly.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from harness.tracking.mlflow_store import normalize_uri

CACHE_ENV = "HARNESS_CACHE"
TRACKING_URI_ENV = "HARNESS_TRACKING_URI"
SUBMITIT_LAUNCHERS = {"SlurmLauncher": "slurm", "LocalLauncher": "submitit_local"}


def launcher_kind(hydra_cfg: Any) -> str:
    """'slurm', 'submitit_local', or the launcher class name (BasicLauncher, JoblibLauncher)."""
    target = str(_get(_get(hydra_cfg, "launcher"), "_target_") or "")
    name = target.rsplit(".", 1)[-1]
    if target.startswith("hydra_plugins.hydra_submitit_launcher.") and name in SUBMITIT_LAUNCHERS:
        return SUBMITIT_LAUNCHERS[name]
    return name or "BasicLauncher"


def is_sqlite(uri: str) -> bool:
    return uri.startswith("sqlite:")


def pin_job_environment(cache_dir: str, tracking_uri: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Export the absolute cache dir and tracking URI for the jobs; returns what was set."""
    environ = os.environ if environ is None else environ
    pinned = {CACHE_ENV: str(Path(cache_dir).resolve()), TRACKING_URI_ENV: normalize_uri(tracking_uri)}
    environ.update(pinned)
    return pinned


def sqlite_on_slurm_warning(tracking_uri: str) -> str:
    return (f"warning: tracking.uri is a SQLite file ({normalize_uri(tracking_uri)}) and the launcher is SLURM: "
            "jobs will not write to it from the compute nodes; this process logs their results when the sweep "
            "ends (or run `python -m harness.tracking push <sweep dir>`). For live logging from the jobs, run an "
            "mlflow server on a database and pass tracking.uri=http://<host>:<port> (docs/clusters.md)")


def prepare_sweep(config: Any, tracking_enabled: bool, tracking_uri: str) -> None:
    """In the launching process, before any job is submitted: pin the environment for
    submitit jobs, and warn about a SQLite store under SLURM."""
    kind = launcher_kind(config.hydra)
    if kind not in SUBMITIT_LAUNCHERS.values():
        return
    pin_job_environment(str(config.cache_dir), tracking_uri)
    if kind == "slurm" and tracking_enabled and is_sqlite(tracking_uri):
        print(sqlite_on_slurm_warning(tracking_uri), file=sys.stderr)


def launcher_logs_for_jobs(hydra_cfg: Any, tracking_uri: str) -> bool:
    """True when the jobs of this sweep leave MLflow to the launching process (SLURM + SQLite)."""
    return launcher_kind(hydra_cfg) == "slurm" and is_sqlite(tracking_uri)


def job_leaves_logging_to_launcher(tracking_uri: str) -> bool:
    """In a job: True when it is one of a SLURM sweep logging to SQLite (see module doc)."""

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    return launcher_logs_for_jobs(HydraConfig.get(), tracking_uri)


def _get(node: Any, key: str) -> Any:
    if node is None:
        return None
    if isinstance(node, dict):
        return node.get(key)
    try:
        return node.get(key) if hasattr(node, "get") else getattr(node, key, None)
    except Exception:  # an OmegaConf node that cannot resolve
        return None
