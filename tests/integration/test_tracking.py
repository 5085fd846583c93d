"""MLflow logging of one result, failure handling, the push command and resume's config hash."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from datetime import datetime
from pathlib import Path

import pytest

from harness.common.files import write_json_atomic
from harness.decode.workload import prompts_digest, workload_record
from harness.job import mlflow_log as tracking
from harness.job.artifacts import code_version
from harness.job.mlflow_log import TrackingConfig
from harness.job.resume import config_hash, index_result, prior_result
from harness.results.run_result import PARAM_MAX_CHARS, RunResult
from harness.tracking import mlflow_ui
from harness.tracking.run_files import RUN_MARKER
from tests.harness_cli import TINY, empty_store, run_module, runs_of, sqlite_uri


def hand_made_result(system: str = "tide", budget: str = "10GB") -> dict:
    return {
        "schema": 1, "system": system, "model": "tiny", "weights": "proxy", "checkpoint": "/x", "timing": "modeled",
        "hardware": "a100_pcie4", "decode_cache": "prefix", "budget": {"name": budget, "experts_per_layer": 64},
        "config": {"model": {"name": "tiny"}, "decode": {"gen_length": 8, "block_length": 4, "cache": "prefix"},
                   "system": {"name": system, "tau": "auto"}, "budget": {"name": budget},
                   "workload": {"name": "coding", "prompts": ["a long prompt " * 80, "b"]},
                   "tracking": {"uri": "http://nowhere:1"}, "cache_dir": "/tmp/c", "resume": False},
        "metrics": {"tokens_per_s": 120.5, "miss_rate": 0.25, "io_gb": 0.5, "lossless": 1, "tau_star": 2,
                    "ratio_ok": True, "note": "text is not a metric"},
        "step_series": [{"global_step": g, "kind": "denoise", "block": 0, "step": g, "miss_rate": 0.1 * g,
                         "modeled_latency_s": 0.01} for g in range(5)],
        "system_report": {"lat_curve": [0.3, 0.2, 0.25], "d": 0.1},
        "outputs": [], "steps": [], "first_text": "", "versions": {"machine": "testbox", "code": code_version()},
    }


def typed(result: dict) -> RunResult:
    return RunResult.from_dict(result)


def write_run(run_dir: Path, result: dict) -> Path:
    write_json_atomic(run_dir / "result.json", result)
    return run_dir


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return empty_store(tmp_path_factory.mktemp("store") / "mlflow.db")


def test_log_run_records_params_tags_metrics_series_and_artifacts(tmp_path: Path, store: Path) -> None:
    from mlflow import MlflowClient

    run_dir = write_run(tmp_path / "run", hand_made_result())
    (run_dir / "throughput.png").write_bytes(b"\x89PNG fake")
    run_id = tracking.log_run(typed(hand_made_result()), run_dir, TrackingConfig(uri=sqlite_uri(store)))
    assert run_id is not None
    client = MlflowClient(tracking_uri=sqlite_uri(store))
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "llada2-tiny"
    assert run.data.params["decode.gen_length"] == "8" and run.data.params["system.name"] == "tide"
    assert len(run.data.params["workload.prompts"]) <= PARAM_MAX_CHARS
    assert not any(k.startswith("tracking.") for k in run.data.params)
    assert run.data.tags["system"] == "tide" and run.data.tags["budget"] == "10GB"
    assert run.data.tags["weights"] == "proxy" and run.data.tags["timing"] == "modeled"
    assert run.data.tags["machine"] == "testbox" and run.data.tags["git_commit"]
    assert run.data.metrics["tokens_per_s"] == 120.5 and run.data.metrics["ratio_ok"] == 1.0
    assert "note" not in run.data.metrics
    steps = client.get_metric_history(run_id, "step_miss_rate")
    assert sorted((m.step, round(m.value, 6)) for m in steps) == [(g, round(0.1 * g, 6)) for g in range(5)]
    assert [m.step for m in client.get_metric_history(run_id, "lat_curve")] == [1, 2, 3]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"result.json", "config.yaml", "plots"} <= artifacts
    assert tracking.is_logged(run_dir, sqlite_uri(store))


def test_experiment_declares_the_model_training_kind(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    store = empty_store(tmp_path / "kind.db")
    client = MlflowClient(tracking_uri=sqlite_uri(store))
    old = client.create_experiment("llada2-old")  # made before the harness declared a kind
    chosen = client.create_experiment("llada2-chosen", tags={mlflow_ui.EXPERIMENT_KIND_TAG: "genai_development"})
    settings = tracking.TrackingConfig(uri=sqlite_uri(store))
    for name in ("llada2-new", "llada2-old", "llada2-chosen"):
        tracking.log_result(typed(hand_made_result()), write_run(tmp_path / name, hand_made_result()),
                            dataclasses.replace(settings, experiment=name))
    kinds = {e.name: e.tags.get(mlflow_ui.EXPERIMENT_KIND_TAG) for e in client.search_experiments()}
    assert kinds["llada2-new"] == kinds["llada2-old"] == "custom_model_development"
    assert kinds["llada2-chosen"] == "genai_development"  # a user's choice is kept
    assert client.get_experiment(old).tags[mlflow_ui.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert chosen


def test_child_run_has_a_description_and_the_workload_as_dataset_input(tmp_path: Path, store: Path) -> None:
    from mlflow import MlflowClient

    prompts = ["a long prompt " * 80, "b"]
    result = {**hand_made_result(), "workload": workload_record({"name": "coding"}, prompts[:1])}
    run_id = tracking.log_run(typed(result), write_run(tmp_path / "run", result), TrackingConfig(uri=sqlite_uri(store)))
    run = MlflowClient(tracking_uri=sqlite_uri(store)).get_run(run_id)
    assert run.data.tags[mlflow_ui.NOTE_TAG] == (
        "**tide** at budget 10GB on `tiny` (proxy weights, modeled timing on a100_pcie4): 120.5 tokens/s (modeled), "
        "miss rate 25.0%, lossless, workload coding (1 prompt).")
    [dataset_input] = run.inputs.dataset_inputs
    dataset = dataset_input.dataset
    assert (dataset.name, dataset.digest) == ("coding", prompts_digest(prompts[:1]))
    assert json.loads(dataset.profile) == {"num_rows": 1} and dataset.source_type == "code"
    assert [(t.key, t.value) for t in dataset_input.tags] == [("mlflow.data.context", "benchmark")]


def test_an_older_result_gets_its_workload_from_its_config() -> None:
    result = hand_made_result()  # no "workload" record: written before runs recorded one
    assert tracking.workload_of(result) == workload_record(result["config"]["workload"],
                                                           result["config"]["workload"]["prompts"])
    limited = {**result, "config": {**result["config"], "limit_prompts": 1}}
    assert tracking.workload_of(limited)["prompts"] == 1
    from_file = {**result, "config": {**result["config"], "workload": {"name": "jsonl", "path": "/p.jsonl"}}}
    assert tracking.workload_of(from_file) is None  # the file may have changed since: no guess


def test_parent_run_is_named_for_its_sweep_and_describes_it(tmp_path: Path, store: Path) -> None:
    from mlflow import MlflowClient

    from harness.tracking import sweep_run

    settings = tracking.TrackingConfig(uri=sqlite_uri(store))
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    run_id = sweep_run.start_parent_run(settings, sweep_dir, {"tiny"}, ["model=tiny", "system=tide,fiddler"])
    client = MlflowClient(tracking_uri=sqlite_uri(store))
    run = client.get_run(run_id)
    assert re.fullmatch(r"system=tide,fiddler · tiny · \d{4}-\d\d-\d\d \d\d:\d\d", run.info.run_name)
    assert "python -m harness -m model=tiny system=tide,fiddler" in run.data.tags[mlflow_ui.NOTE_TAG]
    table = "| job | tok/s |\n|---|---|\n| 0 | 120.5 |\n"
    workload = workload_record({"name": "coding"}, ["a"])
    description = mlflow_ui.parent_description("python -m harness -m model=tiny system=tide,fiddler", table)
    sweep_run.finish_parent_run(settings, run_id, [], {"jobs": 1.0}, description, [workload])
    run = client.get_run(run_id)
    assert run.data.tags[mlflow_ui.NOTE_TAG] == description and table in description
    assert [(d.dataset.name, d.dataset.digest) for d in run.inputs.dataset_inputs] == [("coding", workload["digest"])]
    assert run.info.status == "FINISHED"


def test_push_names_a_parent_from_the_sweeps_multirun_yaml(tmp_path: Path) -> None:
    store = empty_store(tmp_path / "push.db")
    sweep_dir = tmp_path / "sweep"
    write_run(sweep_dir / "0", hand_made_result())
    (sweep_dir / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra: [hydra.sweep.dir=/s, hydra.mode=MULTIRUN]\n"
        "    task: [model=tiny, 'system=tide,fiddler']\n  sweeper:\n    params: {budget: '10GB,18GB'}\n")
    os.utime(sweep_dir / "multirun.yaml", (1796063580, 1796063580))
    assert tracking.main(["push", str(sweep_dir), "--uri", sqlite_uri(store)]) == 0
    [parent] = [r for r in runs_of(store) if r.data.tags["harness.kind"] == "sweep"]
    started = datetime.fromtimestamp(1796063580).strftime("%Y-%m-%d %H:%M")
    assert parent.info.run_name == f"system=tide,fiddler × budget=10GB,18GB · tiny · {started}"
    note = parent.data.tags[mlflow_ui.NOTE_TAG]
    assert "python -m harness -m model=tiny system=tide,fiddler hydra.sweep.dir=/s" in note
    assert [d.dataset.name for d in parent.inputs.dataset_inputs] == ["coding"]


def test_broken_store_is_one_warning_and_no_exception(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    broken = tmp_path / "broken.db"
    broken.write_text("this is not an sqlite database")
    run_dir = write_run(tmp_path / "run", hand_made_result())
    assert tracking.log_run(typed(hand_made_result()), run_dir, TrackingConfig(uri=sqlite_uri(broken))) is None
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "push" in warnings[0]
    assert not tracking.is_logged(run_dir, sqlite_uri(broken))


def test_disabled_tracking_never_opens_a_store(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", hand_made_result())
    settings = TrackingConfig(enabled=False, uri=sqlite_uri(tmp_path / "never.db"))
    assert tracking.log_run(typed(hand_made_result()), run_dir, settings) is None
    assert not (tmp_path / "never.db").exists()


def test_push_logs_only_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = empty_store(tmp_path / "push.db")
    for name in ("a", "b"):
        write_run(tmp_path / "runs" / name, hand_made_result(budget="10GB" if name == "a" else "18GB"))
    assert tracking.main(["push", str(tmp_path / "runs"), "--uri", sqlite_uri(store)]) == 0
    assert "2 logged, 0 already there" in capsys.readouterr().out
    write_run(tmp_path / "runs" / "c", hand_made_result(budget="30GB"))
    assert tracking.main(["push", str(tmp_path / "runs"), "--uri", sqlite_uri(store)]) == 0
    assert "1 logged, 2 already there" in capsys.readouterr().out
    assert sorted(r.data.tags["budget"] for r in runs_of(store)) == ["10GB", "18GB", "30GB"]


def test_config_hash_ignores_where_things_are_recorded() -> None:
    base = hand_made_result()["config"]
    moved = {**base, "tracking": {"uri": "sqlite:///elsewhere.db"}, "cache_dir": "/other", "resume": True,
             "hydra": {"x": 1}}
    assert config_hash(moved) == config_hash(base)
    assert config_hash({**base, "decode": {**base["decode"], "gen_length": 16}}) != config_hash(base)


def test_prior_result_requires_the_indexed_result_to_still_match(tmp_path: Path) -> None:
    result = hand_made_result()
    run_dir = write_run(tmp_path / "run", result)
    index_result(result["config"], run_dir, tmp_path / "cache")
    assert prior_result(result["config"], tmp_path / "cache") == (run_dir / "result.json").resolve()
    write_run(run_dir, {**result, "config": {**result["config"], "limit_prompts": 3}})  # overwritten by another config
    assert prior_result(result["config"], tmp_path / "cache") is None
    (run_dir / "result.json").unlink()
    assert prior_result(result["config"], tmp_path / "cache") is None


def test_resume_in_the_same_sweep_dir_reuses_a_result_that_was_never_indexed(tmp_path: Path) -> None:
    """A job killed after writing result.json but before its index entry: the same sweep dir
    resumed finds it in the job's own run dir; another config's result there is not reused."""
    result = hand_made_result()
    run_dir = write_run(tmp_path / "sweep" / "0", result)
    assert prior_result(result["config"], tmp_path / "cache") is None  # nothing indexed
    assert prior_result(result["config"], tmp_path / "cache", run_dir) == (run_dir / "result.json").resolve()
    other = {**result["config"], "limit_prompts": 3}
    assert prior_result(other, tmp_path / "cache", run_dir) is None
    (run_dir / "result.json").write_text("{truncated")
    assert prior_result(result["config"], tmp_path / "cache", run_dir) is None


def test_resume_never_reuses_a_result_of_other_code(tmp_path: Path) -> None:
    result = hand_made_result()
    for code, expect_reuse in (("older-code", False), (None, False), (code_version(), True)):
        versions = {"machine": "testbox"} if code is None else {"machine": "testbox", "code": code}
        run_dir = write_run(tmp_path / str(code), {**result, "versions": versions})
        index_result(result["config"], run_dir, tmp_path / "cache")
        assert (prior_result(result["config"], tmp_path / "cache") is not None) == expect_reuse, code


def test_resume_never_reuses_a_result_of_another_backend(tmp_path: Path) -> None:
    import torch

    here = "cuda" if torch.cuda.is_available() else "cpu"
    elsewhere = "cpu" if here == "cuda" else "cuda"
    config = {**hand_made_result()["config"], "backend": "auto"}
    for backend, expect_reuse in ((elsewhere, False), (here, True)):
        run_dir = write_run(tmp_path / backend, {**hand_made_result(), "config": config, "backend": backend})
        index_result(config, run_dir, tmp_path / "cache", backend)
        assert (prior_result(config, tmp_path / "cache") is not None) == expect_reuse, backend


@pytest.mark.slow
def test_unreachable_server_keeps_the_result_and_push_brings_it_in(
        tmp_path: Path, proxy_cache: Path, tiny_dir: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_module("harness", [*TINY, "system=gpu_only", "tracking.uri=http://127.0.0.1:9",
                                  f"hydra.run.dir={run_dir}"], proxy_cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["system"] == "gpu_only"
    warnings = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "127.0.0.1:9" in warnings[0], proc.stderr[-2000:]
    assert not (run_dir / RUN_MARKER).exists()

    store = empty_store(tmp_path / "mlflow.db")
    pushed = run_module("harness.tracking", ["push", str(tmp_path), "--uri", sqlite_uri(store)], proxy_cache)
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    assert "1 logged, 0 already there" in pushed.stdout
    runs = runs_of(store)
    assert len(runs) == 1 and runs[0].data.metrics["tokens_per_s"] == round(result["metrics"]["tokens_per_s"], 1)
    assert runs[0].data.tags["run_dir"] == str(run_dir.resolve())
    assert tracking.is_logged(run_dir, sqlite_uri(store))


def test_push_of_a_missing_directory_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert tracking.main(["push", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
