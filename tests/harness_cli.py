"""Running `python -m harness` (and friends) in a subprocess for the sweep and tracking tests."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from tests import process_wait

REPO = Path(__file__).resolve().parent.parent

# the smallest decode that still runs a prefill, denoising steps and a commit
TINY = ["model=tiny", "decode.gen_length=4", "decode.block_length=4", "decode.steps=2", "limit_prompts=1",
        "show_text=false"]


def tiny_with(*overrides: str) -> list[str]:
    """TINY with some of its values replaced (the command line refuses a key given twice)."""
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    return [*(t for t in TINY if t.split("=", 1)[0] not in keys), *overrides]


SYSTEMS = "system=gpu_only,mixtral_offload"
BUDGETS = "budget=10GB,18GB"


def harness_env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HARNESS_CACHE"] = str(cache)
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def run_module(module: str, args: list[str], cache: Path) -> subprocess.CompletedProcess:
    """`python -m module args` to its end: no wall-clock deadline, only a hang fails (tests/process_wait.py)."""
    return process_wait.run([sys.executable, "-m", module, *args], f"python -m {module}", cwd=REPO,
                            env=harness_env(cache))


def sqlite_uri(path: Path) -> str:
    return f"sqlite:///{path}"


@lru_cache(maxsize=1)
def _template_store() -> Path:
    """An empty, migrated MLflow sqlite store (creating one runs migrations for seconds)."""
    from mlflow import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="mlflow-template-"))
    atexit.register(shutil.rmtree, folder, True)
    MlflowClient(tracking_uri=sqlite_uri(folder / "mlflow.db")).search_experiments()
    return folder / "mlflow.db"


def empty_store(path: Path) -> Path:
    """A fresh MLflow sqlite store at `path`, copied from a template."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template_store(), path)
    return path


def sweep(sweep_dir: Path, store: Path, cache: Path, *extra: str, budgets: str = BUDGETS
          ) -> subprocess.CompletedProcess:
    """The 2x2 tiny sweep (systems x budgets) into sweep_dir, tracked in the sqlite file `store`."""
    if not store.exists():
        empty_store(store)
    proc = run_module("harness", ["-m", *TINY, SYSTEMS, budgets, f"tracking.uri={sqlite_uri(store)}",
                                  f"hydra.sweep.dir={sweep_dir}", *extra], cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def runs_of(store: Path) -> list:
    """Every active run of every experiment in a sqlite store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=sqlite_uri(store))
    experiments = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(experiments, max_results=1000))


def parent_and_children(store: Path) -> tuple[list, list]:
    runs = runs_of(store)
    parents = [r for r in runs if r.data.tags.get("harness.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("harness.kind") == "job"]
    return parents, children
