"""A sweep that ends early never leaves its MLflow parent run RUNNING: the parent-run guard
(SIGTERM, Ctrl-C, an exception), an interrupted child log, and resume=true in the same
sweep dir, which reuses the unfinished parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.job import mlflow_log as tracking
from harness.job.mlflow_log import TrackingConfig
from harness.results.run_result import RunResult
from harness.tracking import sweep_run
from harness.tracking.sweep_run import ENDED_TAG, RESUMES_TAG
from tests import process_wait
from tests.harness_cli import REPO, empty_store, harness_env, parent_and_children, runs_of, sqlite_uri, tiny_with
from tests.integration.test_tracking import hand_made_result, write_run


@pytest.fixture
def settings(tmp_path: Path) -> TrackingConfig:
    return TrackingConfig(uri=sqlite_uri(empty_store(tmp_path / "mlflow.db")))


def client_of(settings: TrackingConfig):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=settings.uri)


def new_parent(settings: TrackingConfig, sweep_dir: Path) -> str:
    return sweep_run.start_parent_run(settings, sweep_dir, {"tiny"}, ["system=a,b"])


# --------------------------------------------------------------------------- the guard, in this process


def test_exit_after_an_exception_ends_the_parent_failed(settings: TrackingConfig, tmp_path: Path) -> None:
    run_id = new_parent(settings, tmp_path / "sweep")
    guard = sweep_run.ParentRunGuard(settings, run_id)
    try:
        guard.at_exit()  # what atexit does when the sweep stopped on an exception
    finally:
        guard.release()
    run = client_of(settings).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[ENDED_TAG] == "failed" and "harness.signal" not in run.data.tags


def test_sigterm_raises_system_exit_and_the_parent_ends_killed(settings: TrackingConfig, tmp_path: Path) -> None:
    run_id = new_parent(settings, tmp_path / "sweep")
    before = signal.getsignal(signal.SIGTERM)
    guard = sweep_run.ParentRunGuard(settings, run_id)
    try:
        assert signal.getsignal(signal.SIGTERM) == guard.on_signal
        with pytest.raises(SystemExit) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs at the next bytecode boundary
                time.sleep(0.001)
        assert stopped.value.code == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == before  # a second SIGTERM acts as without the guard
        guard.at_exit()
    finally:
        guard.release()
    run = client_of(settings).get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags[ENDED_TAG] == "interrupted" and run.data.tags["harness.signal"] == "SIGTERM"


@pytest.fixture(params=["handled", "ignored"])
def inherited_sigint(request: pytest.FixtureRequest):
    """The SIGINT disposition the guard starts from, set here whatever this process
    inherited: Python's KeyboardInterrupt handler (a foreground start), or ignored (nohup,
    a background job, where Python leaves SIGINT ignored). Restored afterwards."""
    handler = signal.default_int_handler if request.param == "handled" else signal.SIG_IGN
    outer = signal.signal(signal.SIGINT, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGINT, outer)


def test_release_restores_the_handlers_and_leaves_the_run_alone(
        settings: TrackingConfig, tmp_path: Path, inherited_sigint: object) -> None:
    run_id = new_parent(settings, tmp_path / "sweep")
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    guard = sweep_run.ParentRunGuard(settings, run_id)
    try:
        # a handled SIGINT is wrapped; an ignored one stays ignored (Ctrl-C cannot reach the sweep)
        wrapped = guard.on_signal if inherited_sigint is signal.default_int_handler else signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == wrapped
        assert signal.getsignal(signal.SIGTERM) == guard.on_signal
    finally:
        guard.release()
    assert {s: signal.getsignal(s) for s in before} == before
    guard.at_exit()
    assert client_of(settings).get_run(run_id).info.status == "RUNNING"


def test_an_interrupted_child_log_is_ended_killed_and_deleted(
        settings: TrackingConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.entities import ViewType

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    run_dir = write_run(tmp_path / "run", hand_made_result())
    monkeypatch.setattr(tracking, "log_config_yaml", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tracking.log_result(RunResult.from_dict(hand_made_result()), run_dir, settings)
    client = client_of(settings)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, run_view_type=ViewType.ALL)
    assert [(r.info.status, r.info.lifecycle_stage) for r in runs] == [("KILLED", "deleted")]
    assert not tracking.is_logged(run_dir, settings.uri) and (run_dir / "result.json").is_file()


def test_ctrl_c_during_a_child_log_waits_for_it_and_leaves_the_store_writable(
        settings: TrackingConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pythons_sigint_handler) -> None:
    """CI once saw the Ctrl-C land inside a child's logging: the store stayed locked and the
    parent could not be ended. Now the child is logged whole, then the interrupt acts."""
    real_log_config_yaml = tracking.log_config_yaml

    def ctrl_c_half_way(*args: object) -> None:
        signal.raise_signal(signal.SIGINT)
        real_log_config_yaml(*args)

    parent = new_parent(settings, tmp_path / "sweep")
    run_dir = write_run(tmp_path / "run", hand_made_result())
    monkeypatch.setattr(tracking, "log_config_yaml", ctrl_c_half_way)
    with pytest.raises(KeyboardInterrupt):
        tracking.log_result(RunResult.from_dict(hand_made_result()), run_dir, settings, parent)
    assert tracking.is_logged(run_dir, settings.uri)
    client = client_of(settings)
    children = client.search_runs([client.get_run(parent).info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent}'")
    assert [r.info.status for r in children] == ["FINISHED"]
    logged_after_the_signal = [f.path for f in client.list_artifacts(children[0].info.run_id)]
    assert "config.yaml" in logged_after_the_signal
    sweep_run.end_parent_run(settings, parent, "KILLED", "interrupted", "SIGINT")
    assert client.get_run(parent).info.status == "KILLED"


# --------------------------------------------------------------------------- which parent a sweep gets


def test_resume_reuses_an_unfinished_parent_and_drops_its_orphaned_children(
        settings: TrackingConfig, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    run_id = new_parent(settings, sweep_dir)
    client = client_of(settings)
    experiment_id = client.get_run(run_id).info.experiment_id
    orphan = client.create_run(experiment_id, tags={"mlflow.parentRunId": run_id}).info.run_id  # log cut short
    sweep_run.end_parent_run(settings, run_id, "KILLED", "interrupted", "SIGTERM")

    assert sweep_run.open_parent_run(settings, sweep_dir, {"tiny"}, ["x"], resume=True) == (run_id, True)
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and ENDED_TAG not in run.data.tags and run.data.tags[RESUMES_TAG] == "1"
    assert client.get_run(orphan).info.lifecycle_stage == "deleted"
    sweep_run.finish_parent_run(settings, run_id, [], {})
    assert client.get_run(run_id).data.tags[ENDED_TAG] == "finished"

    # a finished sweep is not reopened: its rerun is a new sweep
    new_id, reused = sweep_run.open_parent_run(settings, sweep_dir, {"tiny"}, ["x"], resume=True)
    assert not reused and new_id != run_id
    assert tracking.parent_run_id(sweep_dir, settings.uri) == new_id


def test_without_resume_a_parent_left_running_is_ended_and_replaced(settings: TrackingConfig, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    old = new_parent(settings, sweep_dir)  # its process was SIGKILLed: still RUNNING
    new_id, reused = sweep_run.open_parent_run(settings, sweep_dir, {"tiny"}, ["x"], resume=False)
    assert not reused and new_id != old
    run = client_of(settings).get_run(old)
    assert run.info.status == "KILLED" and run.data.tags[ENDED_TAG] == "abandoned"


# --------------------------------------------------------------------------- a real sweep, killed and resumed

# three jobs of a config no other test runs, so that resume finds only this sweep's results
SWEEP = [*tiny_with("decode.gen_length=8"), "budget=55GB", "system=gpu_only,fiddler,mixtral_offload"]


@pytest.mark.slow
def test_sigterm_ends_the_parent_killed_and_resume_finishes_it(
        tmp_path: Path, proxy_cache: Path, tiny_dir: Path) -> None:
    store = empty_store(tmp_path / "mlflow.db")
    sweep_dir = tmp_path / "sweep"
    args = [sys.executable, "-m", "harness", "-m", *SWEEP, f"tracking.uri={sqlite_uri(store)}",
            f"hydra.sweep.dir={sweep_dir}"]
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        proc = process_wait.start(args, cwd=REPO, env=harness_env(proxy_cache), stdout=out, stderr=subprocess.STDOUT)
        try:
            process_wait.wait_until((sweep_dir / "0" / "result.json").is_file, proc, "the sweep's first result")
            proc.send_signal(signal.SIGTERM)
            process_wait.finish(proc, "the sweep after SIGTERM")
            returncode = proc.returncode
        finally:
            if proc.poll() is None:
                process_wait.kill_tree(proc)
    output = log.read_text()
    parents, _ = parent_and_children(store)
    assert len(parents) == 1, output[-3000:]
    parent = parents[0]
    assert parent.info.status == "KILLED", output[-3000:]
    assert returncode == 128 + signal.SIGTERM, output[-3000:]  # SystemExit(143), not death by the signal
    assert parent.data.tags[ENDED_TAG] == "interrupted" and parent.data.tags["harness.signal"] == "SIGTERM"
    running = [(r.data.tags, r.info) for r in runs_of(store) if r.info.status == "RUNNING"]
    assert not running, f"{running}\n{output[-3000:]}"
    assert not (sweep_dir / "sweep_summary.csv").exists()  # the sweep really was cut short

    resumed = process_wait.run([*args, "resume=true"], "the resumed sweep", cwd=REPO, env=harness_env(proxy_cache))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # job 0 is skipped, or run again if the signal came before its result was indexed for resume
    done = [ln.split(":")[0] for ln in resumed.stdout.splitlines() if ln.startswith(("[ok] #", "[skipped] #"))]
    assert sorted(ln.split()[-1] for ln in done) == ["#0", "#1", "#2"], resumed.stdout[-3000:]
    parents, children = parent_and_children(store)
    assert [p.info.run_id for p in parents] == [parent.info.run_id]
    run = parents[0]
    assert run.info.status == "FINISHED" and run.data.tags[ENDED_TAG] == "finished"
    assert run.data.tags[RESUMES_TAG] == "1" and run.data.metrics["jobs"] == 3
    # every result of this sweep dir is a child of the one parent, the interrupted job's included
    job_dirs = [sweep_dir / str(n) for n in range(3)]
    assert all((d / "result.json").is_file() for d in job_dirs)
    assert all(tracking.is_logged(d, sqlite_uri(store)) for d in job_dirs)
    assert sorted(c.data.tags["run_dir"] for c in children) == [str(d.resolve()) for d in job_dirs]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {run.info.run_id}
    assert all(c.info.status == "FINISHED" for c in children)
