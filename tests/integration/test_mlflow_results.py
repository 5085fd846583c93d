"""MLflow shows results first: the saved view "Results", names that carry the swept values,
the job's own duration, constants as params, the parent's best system and figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.cli import callbacks
from harness.job import mlflow_log as tracking
from harness.job.config import register_configs
from harness.results.records import record_from_result
from harness.results.run_result import CONSTANT_METRICS, RunResult
from harness.tracking import mlflow_view, sweep_run
from harness.tracking.settings import TrackingConfig
from tests.harness_cli import empty_store, sqlite_uri
from tests.integration.test_tracking import hand_made_result, write_run
from tests.unit.test_plots import run_result


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return empty_store(tmp_path / "mlflow.db")


def client_of(store: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=sqlite_uri(store))


def result_with_constants() -> dict:
    result = hand_made_result()
    result["metrics"].update(experts_per_layer=64, experts_per_layer_derived=63, budget_gb=10.0, prompts=2)
    result.update(started_at=1_800_000_000.0, finished_at=1_800_000_042.5)
    return result


def test_constants_are_params_and_the_duration_is_the_jobs(tmp_path: Path, store: Path) -> None:
    data = result_with_constants()
    run_id = tracking.log_run(RunResult.from_dict(data), write_run(tmp_path / "run", data),
                              TrackingConfig(uri=sqlite_uri(store)))
    run = client_of(store).get_run(run_id)
    assert run.data.params["experts_per_layer"] == "64" and run.data.params["prompts"] == "2"
    assert not CONSTANT_METRICS & set(run.data.metrics)
    assert run.data.metrics["tokens_per_s"] == 120.5  # results stay metrics
    assert run.info.start_time == 1_800_000_000_000 and run.info.end_time == 1_800_000_042_500


def test_a_result_without_times_is_logged_now(tmp_path: Path, store: Path) -> None:
    data = hand_made_result()
    run_id = tracking.log_run(RunResult.from_dict(data), write_run(tmp_path / "run", data),
                              TrackingConfig(uri=sqlite_uri(store)))
    info = client_of(store).get_run(run_id).info
    assert info.end_time >= info.start_time > 1_700_000_000_000


def sweep_with_a_job(root: Path, job_overrides: list[str]) -> Path:
    (root / "multirun.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra: [hydra.mode=MULTIRUN]\n"
        "    task: [model=tiny, 'system=tide,fiddler', 'system.tau=1,4', decode.threshold=0.9]\n")
    job = write_run(root / "3", hand_made_result())
    (job / ".hydra").mkdir()
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in job_overrides))
    return job


def test_child_run_name_carries_every_swept_value(tmp_path: Path, store: Path) -> None:
    job = sweep_with_a_job(tmp_path / "sweep", ["model=tiny", "system=tide", "system.tau=4", "decode.threshold=0.9"])
    assert sweep_run.job_swept_values(job) == {"system": "tide", "system.tau": "4"}
    run_id = tracking.log_run(RunResult.from_dict(hand_made_result()), job, TrackingConfig(uri=sqlite_uri(store)))
    assert client_of(store).get_run(run_id).info.run_name == "tide-10GB-tiny system.tau=4"
    single = write_run(tmp_path / "single", hand_made_result())
    assert sweep_run.job_swept_values(single) == {}


def view_of(store: Path, name: str = "llada2-tiny") -> dict:
    experiment = client_of(store).get_experiment_by_name(name)
    envelope = json.loads(experiment.tags[mlflow_view.VIEW_TAG])
    return {**envelope, "state": json.loads(envelope["state"])}


def test_every_experiment_gets_the_results_view_and_sweeps_add_their_params(tmp_path: Path, store: Path) -> None:
    settings = TrackingConfig(uri=sqlite_uri(store))
    tracking.log_run(RunResult.from_dict(hand_made_result()), write_run(tmp_path / "r", hand_made_result()), settings)
    view = view_of(store)
    assert view["name"] == mlflow_view.VIEW_NAME
    columns = view["state"]["selectedColumns"]
    for metric in ("tokens_per_s", "miss_rate", "tau_star", "lossless", "io_gb"):
        assert f"metrics.`{metric}`" in columns
    assert "params.`system.name`" in columns and "attributes.`Dataset`" in columns
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    sweep_run.start_parent_run(settings, sweep_dir, {"tiny"}, ["model=tiny", "system.tau=1,4", "block=32,64"])
    columns = view_of(store)["state"]["selectedColumns"]
    assert "params.`system.tau`" in columns and "params.`block`" in columns
    assert view_of(store)["createdAt"] == view["createdAt"]  # the same view, extended


def test_a_view_saved_over_in_the_ui_is_left_alone(tmp_path: Path, store: Path) -> None:
    client = client_of(store)
    experiment_id = client.create_experiment("llada2-tiny")
    theirs = json.dumps({"name": "mine", "createdAt": 1, "updatedAt": 2, "state": "deflate;abc"})
    client.set_experiment_tag(experiment_id, mlflow_view.VIEW_TAG, theirs)
    tracking.log_run(RunResult.from_dict(hand_made_result()), write_run(tmp_path / "r", hand_made_result()),
                     TrackingConfig(uri=sqlite_uri(store)))
    assert client.get_experiment(experiment_id).tags[mlflow_view.VIEW_TAG] == theirs


def test_swept_params_name_the_config_keys() -> None:
    swept = ["experiment=table1", "system=tide,fiddler", "system.tau=1,2", "+block=32,64", "hydra/launcher=x"]
    assert mlflow_view.swept_params(swept) == ["system.name", "system.tau", "block"]


def test_parent_gets_the_best_system_by_name_and_every_figure(tmp_path: Path) -> None:
    runs = [run_result(tau=str(t), tps=100.0 + t) for t in (1, 2, 4)] + [run_result("fiddler", tps=50.0)]
    records = []
    for i, r in enumerate(runs):
        record = record_from_result(r, f"job{i}", order=i)
        record.update(job=i, overrides=f"system={r.identity.system} system.tau={r.config['system'].get('tau')}")
        records.append(record)
    assert callbacks.best_run_tags(records) == {"best_system": "tide (system=tide system.tau=4): 104.0 tok/s (modeled)"}
    assert callbacks.sweep_metrics(records)["best_tokens_per_s"] == 104.0
    files = {p.name for p in callbacks.write_sweep_summary(tmp_path, records)}
    assert {"throughput.png", "throughput.pdf", "throughput.svg"} <= files
    tau = [f for f in files if f.startswith("tau_sweep_")]
    assert sorted(Path(f).suffix for f in tau) == [".pdf", ".png", ".svg"]  # the tau sweep's own figure
    assert {p.name for p in sweep_run.sweep_figures(tmp_path)} == {f for f in files if not f.startswith("sweep_")}
    failed = [{**records[0], "status": "failed", "tokens_per_s": math.nan}]
    assert callbacks.best_run_tags(failed) == {}


def test_a_single_run_says_where_its_result_and_mlflow_run_are(tmp_path: Path, store: Path) -> None:
    from harness.cli.overrides import compose_checked

    register_configs()
    cfg = compose_checked(["model=tiny", f"tracking.uri={sqlite_uri(store)}"])
    run_dir = write_run(tmp_path / "run", hand_made_result())
    run_id = tracking.log_run(RunResult.from_dict(hand_made_result()), run_dir, cfg.tracking)
    lines = tracking.where_lines(run_dir, cfg, run_id)
    assert lines[0] == f"result: {(run_dir / 'result.json').resolve()}"
    assert lines[1].startswith(f"MLflow run: http://127.0.0.1:5000/#/experiments/1/runs/{run_id} (after: mlflow ui")
    assert tracking.where_lines(run_dir, cfg, None) == lines[:1]
