"""DALI's measures on whole runs (harness/job/measures.py): a family run reports every one
of them, for the run and per phase, into result.json and the MLflow record; a replay of a
recorded trace gives the live run's figures exactly, and so does a live run that keeps its
trace in memory only; LLaDA2 runs report none unless measures=true; expert-parallel runs
none at all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.results.run_result import RunResult
from harness.results.schema import metric_entry

register_configs()
SMALL = ["decode.gen_length=8", "limit_prompts=2", "tracking.enabled=false", "budget=custom"]
MEASURE = re.compile(r"(gpu_busy_share|cpu_busy_share|cpu_expert_share|cpu_side_share|expert_hit_rate|"
                     r"prefetch_(precision|recall)_(residual|token_count)|cache_hit_rate_(workload|lru|lfu))"
                     r"(_(prefill|decode|denoise|commit))?")


def run(overrides: list[str], cache: Path, run_dir: Path) -> RunResult:
    return run_job(compose_checked([*SMALL, f"cache_dir={cache}", *overrides]), run_dir)


def measures(result: RunResult) -> dict[str, float]:
    return {k: v for k, v in result.flat_metrics().items() if MEASURE.fullmatch(k)}


def test_a_family_run_reports_every_measure_per_phase_in_result_and_mlflow(proxy_cache: Path,
                                                                          tmp_path: Path) -> None:
    result = run(["model=olmoe", "system=dali", "budget.gpu_gb=4"], proxy_cache, tmp_path)
    got = measures(result)
    bases = ["gpu_busy_share", "cpu_busy_share", "cpu_expert_share", "cpu_side_share", "expert_hit_rate",
             "prefetch_precision_residual", "prefetch_recall_residual", "prefetch_precision_token_count",
             "prefetch_recall_token_count", "cache_hit_rate_workload", "cache_hit_rate_lru", "cache_hit_rate_lfu"]
    for base in bases:
        assert {base, f"{base}_prefill", f"{base}_decode"} <= set(got), base
    assert all(0 <= v <= 1 for v in got.values()) and all(metric_entry(k) for k in got)
    # one decode token routes top_k experts: as many named as used
    assert got["prefetch_precision_residual_decode"] == got["prefetch_recall_residual_decode"]
    saved = RunResult.from_json(tmp_path / "result.json")
    assert measures(saved) == got
    record = saved.to_mlflow(tmp_path, None, "commit")
    assert {k: record.metrics[k] for k in got} == got


def test_a_replay_and_a_live_run_without_a_recording_give_the_live_figures(proxy_cache: Path,
                                                                           tmp_path: Path) -> None:
    base = ["model=olmoe", "system=dali", "budget.gpu_gb=4"]
    recorded = run([*base, "trace.record=true"], proxy_cache, tmp_path / "live")
    in_memory = run(base, proxy_cache, tmp_path / "memory")
    replay = run([*base, "source=trace", f"trace.path={tmp_path / 'live' / 'trace.npz'}"], proxy_cache,
                 tmp_path / "replay")
    assert measures(recorded) and measures(in_memory) == measures(recorded)
    assert measures(replay) == measures(recorded)


def test_llada2_runs_report_measures_only_when_asked(proxy_cache: Path, tmp_path: Path) -> None:
    tiny = ["model=tiny", "decode.block_length=8", "decode.steps=4", "system=static_split",
            "budget.experts_per_layer=24"]
    assert measures(run(tiny, proxy_cache, tmp_path / "default")) == {}
    asked = measures(run([*tiny, "measures=true"], proxy_cache, tmp_path / "asked"))
    assert {"cpu_busy_share_denoise", "cache_hit_rate_lru", "prefetch_recall_residual"} <= set(asked)
    assert measures(run(["model=olmoe", "system=dali", "budget.gpu_gb=4", "measures=false"], proxy_cache,
                        tmp_path / "off")) == {}


@pytest.mark.parametrize("system", ["static_split", "fiddler"])
def test_a_static_placement_hits_what_its_gpu_set_holds(system: str, proxy_cache: Path, tmp_path: Path) -> None:
    """static_split never copies, so every expert off its GPU set misses and runs on the CPU:
    its hit rate is the share of routed experts in the set, and the CPU does the rest."""
    m = measures(run(["model=olmoe", f"system={system}", "budget.gpu_gb=4"], proxy_cache, tmp_path))
    assert 0 < m["expert_hit_rate"] < 1 and m["cpu_busy_share"] > 0
    if system == "static_split":  # concurrent sides: the CPU's busy time fits in the modeled time
        assert m["cpu_busy_share"] <= 1
