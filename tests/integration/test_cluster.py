"""Cluster launchers (harness/tracking/cluster.py) and the sweep-vs-store check (harness/audit_store.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.audit_store import check_sweep, compare, job_dirs, metric_differences
from harness.results.run_result import RunResult
from harness.tracking import cluster
from tests.harness_cli import empty_store, sqlite_uri
from tests.integration.test_sweeps import _compose_hydra

# --------------------------------------------------------------------------- launchers


@pytest.mark.parametrize(("overrides", "kind"), [
    (["hydra/launcher=slurm"], "slurm"),
    (["hydra/launcher=submitit_local"], "submitit_local"),
    (["hydra/launcher=local_parallel"], "JoblibLauncher"),
    ([], "BasicLauncher"),
])
def test_launcher_kind_names_the_composed_launcher(overrides: list[str], kind: str) -> None:
    assert cluster.launcher_kind(_compose_hydra(overrides).hydra) == kind


def test_pinned_environment_holds_absolute_cache_dir_and_tracking_uri(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    environ: dict[str, str] = {}
    pinned = cluster.pin_job_environment("outputs/cache", "sqlite:///outputs/mlflow.db", environ)
    assert environ == pinned == {"HARNESS_CACHE": str(tmp_path / "outputs/cache"),
                                 "HARNESS_TRACKING_URI": f"sqlite:///{tmp_path}/outputs/mlflow.db"}
    cluster.pin_job_environment("/abs/cache", "http://127.0.0.1:5000", environ)
    assert environ == {"HARNESS_CACHE": "/abs/cache", "HARNESS_TRACKING_URI": "http://127.0.0.1:5000"}


def test_jobs_compose_the_pinned_values_and_the_command_line_still_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CACHE", "/shared/cache")
    monkeypatch.setenv("HARNESS_TRACKING_URI", "http://mlflow-host:5000")
    cfg = _compose_hydra([])
    assert (cfg.cache_dir, cfg.tracking.uri) == ("/shared/cache", "http://mlflow-host:5000")
    cfg = _compose_hydra(["tracking.uri=http://other:5000"])
    assert cfg.tracking.uri == "http://other:5000"
    monkeypatch.delenv("HARNESS_TRACKING_URI")
    assert _compose_hydra([]).tracking.uri == "sqlite:///outputs/mlflow.db"


@pytest.mark.parametrize(("launcher", "uri", "warned", "pinned"), [
    ("slurm", "sqlite:///outputs/mlflow.db", True, True),
    ("slurm", "http://127.0.0.1:5000", False, True),
    ("submitit_local", "sqlite:///outputs/mlflow.db", False, True),
    ("local_parallel", "sqlite:///outputs/mlflow.db", False, False),
])
def test_prepare_sweep_pins_for_submitit_and_warns_only_for_sqlite_on_slurm(
        launcher: str, uri: str, warned: bool, pinned: bool, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("HARNESS_CACHE", raising=False)
    monkeypatch.delenv("HARNESS_TRACKING_URI", raising=False)
    config = _compose_hydra([f"hydra/launcher={launcher}", f"tracking.uri={uri}"])
    cluster.prepare_sweep(config, True, uri)
    assert ("SQLite" in capsys.readouterr().err) == warned
    import os

    assert ("HARNESS_TRACKING_URI" in os.environ) == pinned
    assert cluster.launcher_logs_for_jobs(config.hydra, uri) == warned


# --------------------------------------------------------------------------- store check on hand-made runs


def _run(run_id: str, status: str = "FINISHED", run_dir: Path | None = None, metrics: dict | None = None,
         tags: dict | None = None) -> SimpleNamespace:
    all_tags = {**(tags or {}), **({"run_dir": str(run_dir)} if run_dir else {})}
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status=status),
                           data=SimpleNamespace(tags=all_tags, metrics=metrics or {}))


def _sweep_dir(tmp_path: Path, n: int) -> Path:
    for i in range(n):
        job = tmp_path / "sweep" / str(i)
        job.mkdir(parents=True)
        (job / "result.json").write_text(json.dumps({"metrics": {"tokens_per_s": 10.0 + i, "lossless": True,
                                                                 "miss_rate": math.nan, "label": "x"}}))
    return (tmp_path / "sweep").resolve()


def _children(sweep: Path, n: int) -> list[SimpleNamespace]:
    return [_run(f"c{i}", run_dir=sweep / str(i),
                 metrics={"tokens_per_s": 10.0 + i, "lossless": 1.0, "miss_rate": math.nan, "step_x": 3.0})
            for i in range(n)]


def test_store_check_passes_one_finished_parent_and_each_job_logged_once(tmp_path: Path) -> None:
    sweep = _sweep_dir(tmp_path, 3)
    report = compare([_run("p")], "p", _children(sweep, 3), job_dirs(sweep))
    assert report.ok, report.problems
    assert (report.children, report.jobs, report.metrics_checked) == (3, 3, 9)  # the string metric is not one


def test_store_check_names_every_broken_rule(tmp_path: Path) -> None:
    sweep = _sweep_dir(tmp_path, 3)
    children = _children(sweep, 3)
    twice = _run("again", run_dir=sweep / "0", metrics=children[0].data.metrics)
    children[1] = _run("c1", status="RUNNING", run_dir=sweep / "1", metrics={"tokens_per_s": 99.0})
    del children[2]
    report = compare([_run("p", status="KILLED")], "p", [*children, twice], job_dirs(sweep))
    problems = " | ".join(report.problems)
    assert "parent run is KILLED" in problems
    assert "1 children not FINISHED: c1" in problems
    assert f"logged more than once: {sweep / '0'}" in problems
    assert f"job dirs without a child run: {sweep / '2'}" in problems
    assert "1: logged metrics differ from result.json: lossless, miss_rate, tokens_per_s" in problems
    assert compare([_run("p"), _run("q")], "p", [], {}).problems == [
        "2 parent runs for this sweep dir, expected exactly the recorded one"]


def test_a_resumed_job_dir_stands_for_the_result_it_names(tmp_path: Path) -> None:
    sweep = _sweep_dir(tmp_path, 1)
    (sweep / "1").mkdir()
    (sweep / "1" / "resumed.json").write_text(json.dumps({"result": str(sweep / "0" / "result.json")}))
    (sweep / "2").mkdir()  # a job that never finished
    assert job_dirs(sweep) == {sweep / "0": sweep / "0" / "result.json", sweep / "1": sweep / "0" / "result.json"}


def test_metric_differences_treats_nan_as_equal_and_missing_as_different() -> None:
    result = {"metrics": {"a": 1.5, "b": math.nan, "c": 2}}
    assert metric_differences({"a": 1.5, "b": math.nan, "c": 2.0}, result) == []
    assert metric_differences({"a": 1.5000001, "b": 0.0}, result) == ["a", "b", "c"]


# --------------------------------------------------------------------------- store check on a real store


@pytest.mark.slow  # creates an MLflow store: about 10 s alone, a minute on a loaded machine
def test_store_check_reads_a_real_store_and_its_cli_exit_codes(tmp_path: Path) -> None:
    from harness.audit_store import main
    from harness.job.mlflow_log import TrackingConfig, log_result
    from harness.tracking.sweep_run import finish_parent_run, start_parent_run

    sweep = _sweep_dir(tmp_path, 2)
    (sweep / "multirun.yaml").write_text("{}")
    uri = sqlite_uri(empty_store(tmp_path / "store" / "mlflow.db"))
    tracking = TrackingConfig(uri=uri, experiment="cluster-test")
    parent = start_parent_run(tracking, sweep, {"tiny"}, ["system=a,b"])
    for i in range(2):
        result = json.loads((sweep / str(i) / "result.json").read_text())
        log_result(RunResult.from_dict({**result, "model": "tiny", "config": {"job": i}}), sweep / str(i), tracking,
                   parent)
    assert check_sweep(sweep, uri, 2).ok is False  # the parent is still RUNNING
    finish_parent_run(tracking, parent, [], {})
    assert check_sweep(sweep, uri, 2).ok
    assert main([str(sweep), "--uri", uri, "--jobs", "2"]) == 0
    assert main([str(sweep), "--uri", uri, "--jobs", "3"]) == 1
    assert main([str(tmp_path / "nowhere"), "--uri", uri, "--jobs", "2"]) == 2
