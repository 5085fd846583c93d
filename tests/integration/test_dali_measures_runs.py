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
from harness.common.errors import HarnessError
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


# ---- lock-step serving and GEM's profiling cost ------------------------------------------
def test_serving_a_recording_in_batches(proxy_cache: Path, tmp_path: Path) -> None:
    """Four requests, two at a time: half the forwards of one at a time, the same routed
    pairs, every request's TPOT and end-to-end latency; gem and ep_linear serve the same
    batches over four GPUs, and gem reports its profiling cost."""
    live = run(["model=olmoe", "system=gpu_only", "limit_prompts=4", "trace.record=true"], proxy_cache,
               tmp_path / "live")
    path = tmp_path / "live" / "trace.npz"
    one = run(["model=olmoe", "system=fiddler", "limit_prompts=4", "source=trace", f"trace.path={path}",
               "budget.gpu_gb=4"], proxy_cache, tmp_path / "one")
    two = run(["model=olmoe", "system=fiddler", "limit_prompts=4", "source=trace", f"trace.path={path}",
               "budget.gpu_gb=4", "workload.batch=2"], proxy_cache, tmp_path / "two")
    m1, m2 = one.flat_metrics(), two.flat_metrics()
    assert m2["forwards"] * 2 == m1["forwards"] == live.flat_metrics()["forwards"]
    assert m2["routed_pairs"] == m1["routed_pairs"] and m2["serving_batches"] == 2
    assert m2["tpot_p50_s"] <= m2["tpot_p90_s"] <= m2["tpot_p99_s"]
    assert m2["e2e_latency_p99_s"] <= m2["modeled_time_s"] * (1 + 1e-12) and "serving_batches" not in m1
    assert m2["tokens_per_s"] > m1["tokens_per_s"]  # two requests share each forward's non-expert time
    for system in ("ep_linear", "gem"):
        m = run(["model=olmoe", f"system={system}", "limit_prompts=4", "source=trace", f"trace.path={path}",
                 "topology=multi", "topology.n_gpus=4", "topology.variability=high", "workload.batch=4"],
                proxy_cache, tmp_path / system).flat_metrics()
        assert m["serving_batches"] == 1 and m["tpot_p50_s"] == m["tpot_p99_s"]  # one batch: one TPOT
        assert ("gem_profile_samples" in m) == (system == "gem")
        assert not any(k.startswith(("cpu_side_share", "cache_hit_rate")) for k in m)  # nothing offloaded
    # profiling at tile boundaries never needs more samples than every token count (as many here:
    # the batch's largest expert load is under one tile)
    assert m["gem_profile_samples"] <= m["gem_dense_profile_samples"]


def test_a_live_run_refuses_a_batch_in_one_line() -> None:
    with pytest.raises(HarnessError, match=r"workload\.batch=4 serves prompts in lock-step") as info:
        compose_checked(["model=olmoe", "workload.batch=4"])
    assert "\n" not in str(info.value)
