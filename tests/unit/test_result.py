"""RunResult: result.json's round trip, its flat layout, duplicate keys, the summary line
and what MLflow gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results.run_result import DecodedOutputs, DuplicateMetricError, RunIdentity, RunResult, Timing


def live_result() -> RunResult:
    return RunResult(
        identity=RunIdentity(system="tide", model="tiny", weights="proxy", checkpoint="/c", source="live",
                             hardware="a100_pcie4", decode_cache="prefix", backend="cpu"),
        config={"model": {"name": "tiny"}, "system": {"name": "tide", "tau": "auto"},
                "tracking": {"uri": "sqlite:///x.db"}, "workload": {"prompts": ["p" * 900]}},
        budget={"name": "10GB", "experts_per_layer": 64, "gpu_gb": 10.0},
        metrics={"tokens_per_s": 80.0, "prompts": 2, "generated_tokens": 8, "denoise_steps": 4, "miss_rate": 0.25,
                 "io_gb": 0.5, "cpu_expert_tokens": 12, "modeled_time_s": 0.1},
        system_report={"tau_star": 2, "refreshes": 7, "lat_curve": [0.3, 0.2], "note": "text"},
        lossless={"lossless": 1, "token_match_rate": 1.0, "first_diff_prompt": -1, "first_diff_position": -1},
        timing=Timing("modeled", {"wall_s": 4.0, "load_s": 1.5, "wall_tokens_per_s": 2.0}),
        versions={"code": "abc", "machine": "box"},
        step_series=[{"global_step": g, "kind": "denoise", "miss_rate": 0.1 * g, "modeled_latency_s": 0.01}
                     for g in range(3)],
        decoded=DecodedOutputs(outputs=[{"tokens": [1, 2], "n_generated": 2}], steps=[{"kind": "denoise"}],
                               first_text="def f(): pass"),
    )


def replay_result() -> RunResult:
    return RunResult(identity=RunIdentity(system="fiddler", model="mini", source="trace", trace="/t.npz",
                                          replay="fast"),
                     metrics={"tokens_per_s": 9.5, "routed_pairs": 100},
                     timing=Timing("modeled", {"replay_s": 0.5, "layer_steps_per_s": 1e5}))


ROUTING = {"distinct_experts_per_layer_step": 44.0, "top_b_share": 0.9, "unused_experts_per_layer": 3.0,
           "popularity_cv": 1.5, "cross_prompt_popularity_corr": None, "tokens_per_denoise_step": 1.0,
           "top_b_share_step": 1.0, "load_entropy": 0.8, "cosine_by_k": [0.9, None], "B": 64, "forwards": 4,
           "uniform": {"distinct_experts_per_layer_step": 160.0, "top_b_share": 0.3, "cosine_by_k": [0.5]}}


def traced_result() -> RunResult:
    """A live run that recorded a trace: its routing statistics are a section."""
    result = live_result()
    result.routing = ROUTING
    return result


@pytest.mark.parametrize("make", [live_result, replay_result, traced_result])
def test_from_json_of_save_json_is_the_original(make, tmp_path: Path) -> None:
    original = make()
    path = original.save_json(tmp_path / "result.json")
    assert RunResult.from_json(path) == original


def test_result_json_keeps_the_flat_layout_readers_use(tmp_path: Path) -> None:
    data = json.loads(live_result().save_json(tmp_path / "result.json").read_text())
    assert data["timing"] == "modeled" and data["system"] == "tide" and data["backend"] == "cpu"
    assert data["first_text"] == "def f(): pass" and data["outputs"][0]["tokens"] == [1, 2]
    assert data["metrics"] == {**live_result().metrics, **live_result().lossless, **live_result().timing.figures,
                               "tau_star": 2, "refreshes": 7}  # the report's numbers only
    replay = json.loads(replay_result().save_json(tmp_path / "replay.json").read_text())
    assert "backend" not in replay and "outputs" not in replay and replay["replay"] == "fast"


def test_routing_statistics_are_a_section_and_flat_metrics(tmp_path: Path) -> None:
    data = json.loads(traced_result().save_json(tmp_path / "result.json").read_text())
    assert data["routing"] == ROUTING
    assert data["metrics"]["routing_top_b_share"] == 0.9 and data["metrics"]["routing_uniform_top_b_share"] == 0.3
    assert data["metrics"]["routing_cosine_k1"] == 0.9 and "routing_cosine_k2" not in data["metrics"]  # None
    assert "routing_cross_prompt_popularity_corr" not in data["metrics"]
    clash = traced_result()
    clash.metrics["routing_top_b_share"] = 0.1
    with pytest.raises(DuplicateMetricError, match="routing_top_b_share"):
        clash.flat_metrics()


def test_an_older_result_without_sections_reads_its_numbers_as_metrics() -> None:
    data = {"schema": 1, "system": "tide", "timing": "measured", "metrics": {"tokens_per_s": 3.0, "wall_s": 1.0,
            "tau_star": 2}, "system_report": {"tau_star": 2}}
    result = RunResult.from_dict(data)
    assert result.metrics == {"tokens_per_s": 3.0, "wall_s": 1.0} and result.timing.kind == "measured"
    assert result.flat_metrics() == data["metrics"] and result.decoded is None


@pytest.mark.parametrize("section", ["lossless", "timing", "system_report"])
def test_a_key_reported_by_two_sections_is_an_error_and_nothing_is_written(section: str, tmp_path: Path) -> None:
    result = live_result()
    clash = {"lossless": result.lossless, "timing": result.timing.figures, "system_report": result.system_report}
    clash[section]["miss_rate"] = 0.5
    path = tmp_path / "result.json"
    path.write_text("{}")  # an earlier file stays as it was
    with pytest.raises(DuplicateMetricError, match=f"'miss_rate' is reported by both metrics and {section}"):
        result.save_json(path)
    assert path.read_text() == "{}"


def test_summary_lines_of_a_live_result() -> None:
    lines = live_result().summary_lines(show_text=True, show_wall=True)
    assert lines == [
        "[tide] model=tiny (proxy weights) budget=10GB B=64 cache=prefix hardware=a100_pcie4: 2 prompts, 8 tokens, "
        "4 denoising steps | modeled 80.0 tokens/s, wall 2.0 | miss 25.0%, io 0.50 GB, cpu expert tokens 12 "
        "tau*=2 | lossless=1 (match 100.0%)",
        "first prompt's output: 'def f(): pass'",
    ]
    assert len(live_result().summary_lines(show_text=False)) == 1


def test_a_proxy_prints_neither_its_text_nor_a_wall_figure_unless_asked() -> None:
    """A proxy's random weights decode noise, and this CPU's wall tokens/s is no figure of the
    modeled hardware: by default neither is printed for proxies; real weights print both."""
    (line,) = live_result().summary_lines()
    assert "modeled 80.0 tokens/s (live) |" in line and "wall" not in line
    real = live_result()
    real.identity.weights = "real"
    lines = real.summary_lines()
    assert "modeled 80.0 tokens/s, wall 2.0 |" in lines[0] and lines[1] == "first prompt's output: 'def f(): pass'"


def test_to_mlflow_gives_params_metrics_series_and_tags(tmp_path: Path) -> None:
    record = live_result().to_mlflow(tmp_path, "hash1", "commit1")
    assert record.params["system.tau"] == "auto" and "tracking.uri" not in record.params
    assert len(record.params["workload.prompts"]) <= 500
    assert record.metrics["lossless"] == 1.0 and record.metrics["wall_s"] == 4.0 and "note" not in record.metrics
    assert ("step_miss_rate", 0.2, 2) in record.series and ("lat_curve", 0.2, 2) in record.series
    assert record.tags["mlflow.runName"] == "tide-10GB-tiny" and record.tags["config_hash"] == "hash1"
    assert record.tags["git_commit"] == "commit1" and record.tags["machine"] == "box"
    assert record.tags["timing"] == "modeled" and record.tags["run_dir"] == str(tmp_path.resolve())
    # parallel coordinates need a number per system; the chart view a colour per system
    assert record.params["system_id"] == "5" and record.tags["mlflow.runColor"] == "#8c564b"  # tide


def test_mlflow_gets_tokens_per_s_to_one_decimal_and_result_json_every_digit(tmp_path: Path) -> None:
    result = live_result()
    result.metrics["tokens_per_s"] = 80.04999
    assert result.to_mlflow(tmp_path, None, "c").metrics["tokens_per_s"] == 80.0
    assert result.flat_metrics()["tokens_per_s"] == 80.04999


def test_the_summary_line_names_the_charging() -> None:
    result = live_result()
    result.config["system"] = {**result.config.get("system", {}), "overlap": False}
    assert " hardware=a100_pcie4 overlap=false: " in result.summary_lines(show_text=False)[0]


def test_a_model_charged_as_itself_says_so_in_its_summary_line() -> None:
    tiny = live_result()
    tiny.config["model"] = {"name": "tiny", "nominal": "proxy"}
    assert "model=tiny (proxy weights; charged as itself, a smoke-test model: copies cost ~nothing, tokens/s " \
           "does not rank systems) budget=10GB" in tiny.summary_lines(show_text=False)[0]
    mini = live_result()
    mini.config["model"] = {"name": "mini", "nominal": "llada2_mini"}  # charged as LLaDA2.0-mini: no note
    assert "charged as itself" not in mini.summary_lines(show_text=False)[0]
    from harness.tracking.mlflow_ui import child_description

    assert "charged as itself" in child_description(tiny.to_dict())
    assert "charged as itself" not in child_description(mini.to_dict())
