"""Serving with request arrivals on whole replays (harness/job/replay.py,
harness/traces/arrivals.py): imported routing of a config-only model (tests/routing_files.py,
no weights), one request held out as the calibration, served with arrivals:

- every request at time 0 with room for all: what the static lock-step batch charges, to the
  bit, under every system (the engine charging forward by forward, or a batch planner);
- arrivals spaced beyond any request's service: each request alone, what one-at-a-time
  serving charges, to the bit;
- a seeded Poisson process: the per-request figures exist and hang together (queueing
  before the first token, the first token before the last, never more running than
  workload.batch), the same seed gives the same result, another seed another one;
- gem and ep_linear serve arrivals over GPUs of unequal speed; a static run has no
  arrival figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.results.run_result import RunResult
from harness.traces.__main__ import main as traces_main
from tests.routing_files import random_routing, write_config, write_vllm

register_configs()
SINGLE = ["gpu_only", "fiddler", "static_split", "mixtral_offload", "dali", "dali_no_assign", "dali_no_prefetch",
          "dali_no_replacement", "tide", "tide_adaptive", "tide_sequential", "oracle"]
MULTI = ["ep_linear", "gem"]
REQUESTS = 5  # imported; the last is held out as the calibration
SERVED = REQUESTS - 1
WALL_CLOCK = ("replay_s", "layer_steps_per_s")
ARRIVAL_FIGURES = ("queue_p50_s", "queue_p90_s", "queue_p99_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                   "serving_peak_running")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The model and trace settings of a replay of imported routing (prefill, then a token per forward)."""
    root = tmp_path_factory.mktemp("imported")
    config = write_config(root / "model")
    responses = write_vllm(root / "responses.jsonl", random_routing(REQUESTS, seed=5, sticky=0.5))
    trace = root / "trace.npz"
    assert traces_main(["import", "format=vllm", f"in={responses}", "model=hf", f"config={config}",
                        f"out={trace}"]) == 0
    return ["model=hf", f"model.path={config}", f"trace.path={trace}", "budget=custom", "budget.gpu_gb=1",
            "budget.experts_per_layer=4"]


def replay(imported: list[str], system: str, overrides: list[str], run_dir: Path) -> RunResult:
    placement = ["topology=multi", "topology.n_gpus=2"] if system in MULTI else []
    cfg = compose_checked(["source=trace", "tracking.enabled=false", f"cache_dir={run_dir.parent / 'cache'}",
                           f"system={system}", "calibration.from_workload=1", *placement, *imported, *overrides])
    return run_job(cfg, run_dir)


def arrival_file(path: Path, times: list[float]) -> str:
    path.write_text(json.dumps(times))
    return f"workload.arrival_trace={path}"


def metrics(result: RunResult) -> dict[str, float]:
    return {k: v for k, v in result.flat_metrics().items() if k not in WALL_CLOCK}


def test_all_at_zero_with_room_for_all_charges_the_static_batch(imported: list[str], tmp_path: Path) -> None:
    at_zero = arrival_file(tmp_path / "zero.json", [0.0] * SERVED)
    for system in SINGLE + MULTI:
        static = metrics(replay(imported, system, [f"workload.batch={SERVED}"], tmp_path / system / "static"))
        served = replay(imported, system, [f"workload.batch={SERVED}", "workload.arrivals=trace", at_zero],
                        tmp_path / system / "arrivals")
        got = metrics(served)
        assert served.identity.replay == "engine", system
        # what differs: the lock-step count of batches, and the figures only arrivals report
        assert static.pop("serving_batches") == 1 and not any(k in static for k in ARRIVAL_FIGURES), system
        extra = {k: got.pop(k) for k in ARRIVAL_FIGURES}
        assert got == static, system  # every charge, counter and serving figure, to the bit
        assert extra["queue_p99_s"] == 0.0 and extra["serving_peak_running"] == SERVED, system
        assert extra["ttft_p99_s"] == served.step_series[0]["modeled_latency_s"], system  # one prefill forward


def test_arrivals_spaced_beyond_service_charge_one_request_at_a_time(imported: list[str], tmp_path: Path) -> None:
    for system in ("fiddler", "mixtral_offload", "tide_adaptive", "gem"):
        alone = replay(imported, system, [], tmp_path / system / "alone")
        gap = 10 * alone.metrics["modeled_time_s"]
        spaced = tmp_path / f"{system}.csv"  # the CSV form, with a header
        spaced.write_text("arrival_s\n" + "".join(f"{p * gap}\n" for p in range(SERVED)))
        served = metrics(replay(imported, system, ["workload.batch=3", "workload.arrivals=trace",
                                                  f"workload.arrival_trace={spaced}"],
                                tmp_path / system / "spaced"))
        static = metrics(alone)
        assert {k: served[k] for k in static} == static, system
        assert served["queue_p99_s"] == 0.0 and served["serving_peak_running"] == 1, system
        assert served["e2e_latency_p50_s"] < gap, system


def poisson(imported: list[str], system: str, seed: int, run_dir: Path, batch: int = 2) -> RunResult:
    return replay(imported, system, [f"workload.batch={batch}", "workload.arrivals=poisson",
                                     "workload.arrival_rate=200", f"workload.arrival_seed={seed}"], run_dir)


@pytest.mark.parametrize("system", ["mixtral_offload", "gem"])
def test_poisson_arrivals_give_consistent_reproducible_figures(imported: list[str], system: str,
                                                               tmp_path: Path) -> None:
    first = poisson(imported, system, 3, tmp_path / "a")
    m = metrics(first)
    for name in ("queue", "ttft", "tpot", "e2e_latency"):
        assert m[f"{name}_p50_s"] <= m[f"{name}_p90_s"] <= m[f"{name}_p99_s"], name
    # per request: queueing <= time to first token <= end to end (so every percentile too)
    for q in (50, 90, 99):
        assert 0 <= m[f"queue_p{q}_s"] <= m[f"ttft_p{q}_s"] <= m[f"e2e_latency_p{q}_s"], q
    assert 1 <= m["serving_peak_running"] <= 2 and "serving_batches" not in m
    one_at_a_time = metrics(replay(imported, system, [], tmp_path / "alone"))
    assert m["routed_pairs"] == one_at_a_time["routed_pairs"]  # every request's routing, batched or not
    assert m["forwards"] <= one_at_a_time["forwards"]
    saved = RunResult.from_json(tmp_path / "a" / "result.json")
    assert all(saved.metrics[k] == m[k] for k in ARRIVAL_FIGURES)
    assert metrics(poisson(imported, system, 3, tmp_path / "b")) == m  # the same seed: the same run
    other = metrics(poisson(imported, system, 4, tmp_path / "c"))
    assert other["e2e_latency_mean_s"] != m["e2e_latency_mean_s"]


def test_a_static_run_reports_no_arrival_figures(imported: list[str], tmp_path: Path) -> None:
    result = replay(imported, "fiddler", ["workload.batch=2"], tmp_path / "static")
    assert result.config["workload"]["arrivals"] == "static" and result.identity.replay == "fast"
    m = result.flat_metrics()
    assert m["serving_batches"] == 2 and not any(k in m for k in ARRIVAL_FIGURES)
