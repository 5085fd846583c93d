"""Sweeps end to end: parent and child MLflow runs with the basic and the joblib launcher,
the sweep summary, resume after a partial sweep, an MLflow server over the store, and
the launcher configs."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests import process_wait
from tests.harness_cli import REPO, empty_store, parent_and_children, sqlite_uri, sweep

pytestmark = pytest.mark.slow

EXPECTED_METRICS = {"tokens_per_s", "wall_tokens_per_s", "miss_rate", "io_gb", "cpu_expert_tokens", "lossless",
                    "token_match_rate", "step_miss_rate", "step_modeled_latency_s"}
GRID = {("gpu_only", "10GB"), ("gpu_only", "18GB"), ("mixtral_offload", "10GB"), ("mixtral_offload", "18GB")}


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory: pytest.TempPathFactory, proxy_cache: Path, tiny_dir: Path) -> dict:
    root = tmp_path_factory.mktemp("basic")
    proc = sweep(root / "sweep", root / "mlflow.db", proxy_cache)
    return {"root": root, "sweep": root / "sweep", "store": root / "mlflow.db", "proc": proc}


def assert_linked_grid(store: Path) -> None:
    parents, children = parent_and_children(store)
    assert len(parents) == 1 and len(children) == 4
    parent = parents[0]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert {c.info.experiment_id for c in children} == {parent.info.experiment_id}
    assert {(c.data.params["system.name"], c.data.params["budget.name"]) for c in children} == GRID
    assert {(c.data.tags["system"], c.data.tags["budget"]) for c in children} == GRID
    for child in children:
        assert set(child.data.metrics) >= EXPECTED_METRICS, EXPECTED_METRICS - set(child.data.metrics)
        assert "experts_per_layer" in child.data.params and "experts_per_layer" not in child.data.metrics
        assert child.info.status == "FINISHED"
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["jobs_ok"] == 4


def test_basic_launcher_sweep_has_one_parent_and_four_children(basic_sweep: dict) -> None:
    assert_linked_grid(basic_sweep["store"])


def test_sweep_prints_one_line_per_job_and_a_summary(basic_sweep: dict) -> None:
    out = basic_sweep["proc"].stdout
    job_lines = [ln for ln in out.splitlines() if ln.startswith("[ok] #")]
    assert len(job_lines) == 4
    assert "sweep summary" in out
    with open(basic_sweep["sweep"] / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["system"], r["budget"]) for r in rows} == GRID
    assert all(r["status"] == "ok" and float(r["tokens_per_s"]) > 0 for r in rows)
    assert (basic_sweep["sweep"] / "sweep_summary.md").read_text().count("\n| ") == 4
    assert (basic_sweep["sweep"] / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parent_run_carries_the_summary_and_plots(basic_sweep: dict) -> None:
    from mlflow import MlflowClient

    parents, _ = parent_and_children(basic_sweep["store"])
    client = MlflowClient(tracking_uri=sqlite_uri(basic_sweep["store"]))
    paths = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"sweep_summary.csv", "sweep_summary.md", "plots"} <= paths


def test_children_have_step_series_and_artifacts(basic_sweep: dict) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=sqlite_uri(basic_sweep["store"]))
    _, children = parent_and_children(basic_sweep["store"])
    child = children[0]
    result = json.loads((Path(child.data.tags["run_dir"]) / "result.json").read_text())
    history = client.get_metric_history(child.info.run_id, "step_miss_rate")
    assert sorted(m.step for m in history) == [p["global_step"] for p in result["step_series"]]
    assert {"result.json", "config.yaml", "hydra"} <= {a.path for a in client.list_artifacts(child.info.run_id)}


def test_joblib_launcher_sweep_links_children_across_processes(
        tmp_path: Path, proxy_cache: Path, tiny_dir: Path) -> None:
    proc = sweep(tmp_path / "sweep", tmp_path / "mlflow.db", proxy_cache, "hydra/launcher=local_parallel")
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    assert_linked_grid(tmp_path / "mlflow.db")


def test_resume_runs_only_the_missing_jobs(basic_sweep: dict, tmp_path: Path, proxy_cache: Path) -> None:
    """The basic sweep finished the 10GB half of a {systems} x {10GB, 30GB} grid; resume runs the rest."""
    store = empty_store(tmp_path / "mlflow.db")
    proc = sweep(tmp_path / "sweep", store, proxy_cache, "resume=true", budgets="budget=10GB,30GB")

    skipped = [ln for ln in proc.stdout.splitlines() if ln.startswith("[skipped]")]
    ran = [ln for ln in proc.stdout.splitlines() if ln.startswith("[ok]")]
    assert len(skipped) == 2 and all("budget=10GB" in ln for ln in skipped), proc.stdout[-3000:]
    assert len(ran) == 2 and all("budget=30GB" in ln for ln in ran)
    jobs = [d for d in (tmp_path / "sweep").iterdir() if (d / ".hydra").is_dir()]
    assert sum((d / "result.json").is_file() for d in jobs) == 2
    # each skipped job points at an earlier sweep's result (the basic one, or a later sweep of the same configs)
    pointers = [Path(json.loads(p.read_text())["result"]) for p in (tmp_path / "sweep").glob("*/resumed.json")]
    reused = [json.loads(p.read_text()) for p in pointers if tmp_path not in p.parents]
    assert sorted((r["system"], r["budget"]["name"]) for r in reused) == [("gpu_only", "10GB"),
                                                                          ("mixtral_offload", "10GB")]
    with open(tmp_path / "sweep" / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["status"], r["budget"]) for r in rows) == [
        ("ok", "30GB"), ("ok", "30GB"), ("skipped", "10GB"), ("skipped", "10GB")]
    # this store never saw the reused results (the basic sweep logged to its own store), so resume
    # logs them once, as children of this sweep's parent, beside the jobs that ran (docs/tracking.md)
    parents, children = parent_and_children(store)
    assert len(parents) == 1 and len(children) == 4
    assert sorted(c.data.tags["budget"] for c in children) == ["10GB", "10GB", "30GB", "30GB"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    reused_dirs = {str(p.parent) for p in pointers if tmp_path not in p.parents}
    assert {c.data.tags["run_dir"] for c in children if c.data.tags["budget"] == "10GB"} == reused_dirs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _search_runs(port: int, experiment_ids: list[str]) -> dict:
    body = json.dumps({"experiment_ids": experiment_ids, "max_results": 100}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_mlflow_server_lists_the_sweep_runs(basic_sweep: dict, tmp_path: Path) -> None:
    parents, children = parent_and_children(basic_sweep["store"])
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", sqlite_uri(basic_sweep["store"]),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        answer: dict = {}

        def answered() -> bool:  # the server is up when it answers (starting it takes seconds, more under load)
            if server.poll() is not None:
                pytest.skip(f"mlflow server could not start here: {(tmp_path / 'server.log').read_text()[-500:]}")
            try:
                answer.update(_search_runs(port, [parents[0].info.experiment_id]))
            except OSError:
                time.sleep(0.5)
                return False
            return True

        process_wait.wait_until(answered, server, "mlflow server")
        listed = {r["info"]["run_id"] for r in answer["runs"]}
        assert listed == {parents[0].info.run_id} | {c.info.run_id for c in children}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def _compose_hydra(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.job.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def test_slurm_launcher_config_composes_with_command_line_overrides() -> None:
    cfg = _compose_hydra(["hydra/launcher=slurm", "hydra.launcher.partition=a100", "hydra.launcher.timeout_min=90"])
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.partition, launcher.timeout_min, launcher.gpus_per_node) == ("a100", 90, 1)
    assert cfg.hydra.callbacks.sweep._target_ == "harness.cli.callbacks.SweepCallback"


def test_local_parallel_launcher_is_joblib_with_two_jobs() -> None:
    launcher = _compose_hydra(["hydra/launcher=local_parallel"]).hydra.launcher
    assert launcher._target_.endswith("JoblibLauncher") and launcher.n_jobs == 2
