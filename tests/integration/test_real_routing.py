"""Real routing in (docs/real-routing.md): a saved vLLM response file of a model named only by
its config.json imports, replays under every system (lossless=n/a, modeled figures,
calibration from held-out requests) and its routing statistics reach the report; and a
round trip: a harness recording of the `mixtral` geometry exported to vLLM's format,
imported, and replayed gives every counter the recording gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.placement.trace import RoutingTrace
from harness.real_routing import main as real_routing
from harness.report.api import report
from harness.results.run_result import RunResult
from harness.traces.__main__ import main as traces_main
from harness.traces.export import export_vllm
from harness.traces.holdout import hold_out
from harness.traces.routing_stats import statistics_with_uniform
from tests.routing_files import random_routing, write_config, write_vllm

register_configs()
SINGLE = ["gpu_only", "fiddler", "static_split", "mixtral_offload", "dali", "dali_no_assign", "dali_no_prefetch",
          "dali_no_replacement", "tide", "tide_adaptive", "tide_sequential", "oracle"]
MULTI = ["ep_linear", "gem"]
# the clock of the replay itself (seconds of Python), not a modeled figure
WALL_CLOCK = ("replay_s", "layer_steps_per_s")


def replay(overrides: list[str], cache: Path, run_dir: Path, system: str) -> RunResult:
    placement = ["topology=multi", "topology.n_gpus=2", "workload.batch=2"] if system in MULTI else []
    cfg = compose_checked(["source=trace", "tracking.enabled=false", f"cache_dir={cache}", f"system={system}",
                           "calibration.from_workload=1", *placement, *overrides])
    return run_job(cfg, run_dir / system)


def test_a_vllm_file_of_a_config_only_model_replays_under_every_system(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path / "model")
    responses = write_vllm(tmp_path / "responses.jsonl", random_routing(4, seed=11, sticky=0.5))
    trace = tmp_path / "trace.npz"
    assert traces_main(["import", "format=vllm", f"in={responses}", "model=hf", f"config={config}",
                        f"out={trace}"]) == 0
    printed = capsys.readouterr().out
    assert "imported 4 requests" in printed and "temporal_locality" in printed and "lru_hit_rate" in printed
    model = ["model=hf", f"model.path={config}", f"trace.path={trace}", "budget=custom", "budget.gpu_gb=1",
             "budget.experts_per_layer=4"]
    results = {s: replay(model, tmp_path / "cache", tmp_path / "runs", s) for s in SINGLE + MULTI}
    for system, result in results.items():
        m = result.flat_metrics()
        assert result.timing.kind == "modeled" and m["tokens_per_s"] > 0 and m["modeled_time_s"] > 0, system
        assert "lossless" not in m and "lossless=n/a" in result.summary_lines()[0], system
        assert "(real weights, imported routing" in result.summary_lines()[0], system
        assert result.identity.routing_source == "imported" and m["prompts"] == 3, system  # one request held out
        assert result.routing["temporal_locality"] is not None and result.routing["uniform"]["lru_hit_rate"], system
        if system in MULTI:
            assert m["serving_batches"] == 2, system
        else:
            assert m["decode_steps"] == m["generated_tokens"] - 3, system
    assert results["fiddler"].identity.calibration == f"{trace} (its last 1 requests, held out)"
    assert results["gpu_only"].identity.calibration is None
    assert results["dali"].identity.hints == "none" and results["fiddler"].identity.hints is None
    assert results["oracle"].metrics["modeled_time_s"] <= results["mixtral_offload"].metrics["modeled_time_s"]
    report(runs=[tmp_path / "runs"], out=tmp_path / "report", quiet=True)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Routing statistics (uniform routing in parentheses)" in text and "temporal_locality" in text
    assert "| imported: trace.npz |" in re.sub(" +", " ", text)  # the row says which routing its statistics describe


def without_hints(path: Path, out: Path) -> Path:
    """The trace as vLLM can carry it: the same forwards and meta, no next-layer hints."""
    trace = RoutingTrace.load(path)
    bare = RoutingTrace(trace.n_layers, trace.n_experts, geometry=trace.geometry, meta=trace.meta)
    for i, step in enumerate(trace.steps):
        bare.add_step(step, trace.n_tokens[i], trace.n_context[i])
        bare.set_step(i, trace.loads[i].numpy())
    return bare.save(out)


def test_a_round_trip_through_vllms_format_keeps_every_counter(proxy_cache: Path, tmp_path: Path) -> None:
    live = run_job(compose_checked(["model=mixtral", "system=gpu_only", "trace.record=true", "limit_prompts=3",
                                    "decode.gen_length=6", "block=4", "budget=custom", "budget.gpu_gb=24",
                                    "tracking.enabled=false", f"cache_dir={proxy_cache}"]), tmp_path / "live")
    recorded = tmp_path / "live" / "trace.npz"
    assert RoutingTrace.load(recorded).has_hints
    bare = without_hints(recorded, tmp_path / "bare" / "trace.npz")
    imports = {}
    for layout in ("split", "combined"):
        responses = export_vllm(RoutingTrace.load(recorded), tmp_path / f"{layout}.jsonl", layout)
        imports[layout] = tmp_path / f"{layout}.npz"
        assert traces_main(["import", "format=vllm", f"in={responses}", "model=mixtral", "window=4",
                            f"out={imports[layout]}", "weights=random-proxy"]) == 0
    eos = live.metrics["generated_tokens"] < live.metrics["requested_tokens"]
    common = ["model=mixtral", "budget=custom", "budget.gpu_gb=24", "decode.gen_length=6", "block=4"]
    for system in SINGLE + MULTI:
        original = replay([*common, f"trace.path={recorded}"], proxy_cache, tmp_path / "original", system)
        stripped = replay([*common, f"trace.path={bare}"], proxy_cache, tmp_path / "bare_runs", system)
        expected = counters(stripped, eos)
        for layout, path in imports.items():
            got = replay([*common, f"trace.path={path}"], proxy_cache, tmp_path / layout, system)
            assert counters(got, eos) == expected, (system, layout)
            # the import's routing statistics are the recording's (the same loads, forward for forward)
            kept, _ = hold_out(RoutingTrace.load(bare), 1, bare)
            # (but the repetition statistic: vLLM's routed experts carry no token ids, so an import has none)
            want = statistics_with_uniform(kept, got.budget["experts_per_layer"])
            assert all(got.routing[k] is None for k in REPETITION), (system, layout)
            assert without(got.routing, REPETITION) == without(want, REPETITION), (system, layout)
        if original.identity.hints is None:
            # a system that reads no hints replays the recording itself the same, but for the
            # predictor measures computed from the recorded hints
            mine = counters(original, eos)
            differ = {k for k in mine.keys() | expected.keys() if mine.get(k) != expected.get(k)}
            assert all(k.startswith("prefetch_") and ("residual" in k or "next_gate" in k) for k in differ), \
                (system, differ)


REPETITION = ("looping_requests", "repetition_mean", "repetition_max")


def without(stats: dict, keys: tuple[str, ...]) -> dict:
    return {k: v for k, v in stats.items() if k not in keys}


def counters(result: RunResult, eos: bool) -> dict:
    """Every metric of a replay but its wall clock and the routing statistics (an import's
    result carries them; they are compared apart)."""
    m = {k: v for k, v in result.flat_metrics().items() if k not in WALL_CLOCK and not k.startswith("routing_")}
    if eos:  # the import knows what was generated, not what was asked for
        m.pop("requested_tokens", None)
    return m


@pytest.mark.slow
def test_the_grid_runs_over_a_directory_of_imports(tmp_path: Path) -> None:
    """python -m harness.real_routing: each trace on its own model's geometry, B a share of its
    experts and the GPU memory that holds them (a reduced grid: two systems, one share)."""
    config = write_config(tmp_path / "model")
    (tmp_path / "traces").mkdir()
    assert traces_main(["import", "format=vllm", f"in={write_vllm(tmp_path / 'r.jsonl', random_routing(3))}",
                        "model=hf", f"config={config}", f"out={tmp_path / 'traces' / 'tiny.npz'}"]) == 0
    assert real_routing(["dir=" + str(tmp_path / "traces"), "shares=0.5", "systems=gpu_only,fiddler",
                         f"out={tmp_path / 'grid'}"]) == 0
    results = [RunResult.from_json(p) for p in sorted((tmp_path / "grid" / "tiny_B8").glob("*/result.json"))]
    assert sorted(r.identity.system for r in results) == ["fiddler", "gpu_only"]
    for r in results:
        assert r.budget["experts_per_layer"] == 8 and r.identity.routing_source == "imported"
        assert r.config["model"]["path"] == str(config.resolve()) and r.metrics["prompts"] == 2
