"""Replay over a recorded trace reproduces the live run's counters for every system."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.job.live import run_job

register_configs()

COUNTERS = ("routed_pairs", "missed_pairs", "cpu_expert_tokens", "copies_sync", "copies_async", "copies_scratch",
            "io_bytes", "refreshes", "modeled_time_s", "time_gpu_experts_s", "time_cpu_experts_s",
            "time_copies_s", "time_non_expert_s", "generated_tokens", "denoise_steps")
LIVE_SYSTEMS = {
    "gpu_only": [], "fiddler": [], "mixtral_offload": [], "mixtral_offload+prefetch": ["system.prefetch=true"],
    "tide": [], "tide+async": ["system.migration=async", "system.tau=2"], "oracle": [],
    "dali": [], "dali+next_gate": ["system.predictor=next_gate"],  # each reads its own recorded hint channel
}


def overrides(cache: Path, *extra: str) -> list[str]:
    return ["model=tiny", "decode.gen_length=12", "decode.block_length=8", "decode.steps=8", "limit_prompts=2",
            "budget=custom", "budget.experts_per_layer=24", f"cache_dir={cache}", "tracking.enabled=false", *extra]


@pytest.mark.parametrize("variant", list(LIVE_SYSTEMS))
def test_replay_matches_live_counters(variant, proxy_cache, tmp_path, tiny_dir):
    system = variant.split("+")[0]
    extra = [f"system={system}", *LIVE_SYSTEMS[variant]]
    live = run_job(compose_checked(overrides(proxy_cache, *extra, "trace.record=true")), tmp_path / "live")
    assert live["metrics"]["lossless"] == 1
    trace = tmp_path / "live" / "trace.npz"
    replay = run_job(compose_checked(overrides(proxy_cache, *extra, "source=trace", f"trace.path={trace}")),
                     tmp_path / "replay")
    assert replay["source"] == "trace" and "lossless" not in replay["metrics"]
    for key in COUNTERS:
        if key in live["metrics"]:
            assert replay["metrics"][key] == live["metrics"][key], key
    assert [s["miss_rate"] for s in replay["step_series"]] == [s["miss_rate"] for s in live["step_series"]]


def test_replay_of_cached_trace_records_once(proxy_cache, tmp_path, tiny_dir):
    cache = tmp_path / "cache"
    (cache / "proxies").mkdir(parents=True)
    (cache / "proxies" / tiny_dir.name).symlink_to(tiny_dir)
    first = run_job(compose_checked(overrides(cache, "system=tide", "source=trace")), tmp_path / "a")
    traces = list((cache / "traces").glob("*.npz"))
    assert len(traces) == 1
    mtime = traces[0].stat().st_mtime_ns
    second = run_job(compose_checked(overrides(cache, "system=fiddler", "source=trace")), tmp_path / "b")
    assert traces[0].stat().st_mtime_ns == mtime  # reused, not re-recorded
    assert first["metrics"]["routed_pairs"] == second["metrics"]["routed_pairs"]


def test_replay_refuses_a_trace_of_another_geometry(proxy_cache, tmp_path, tiny_dir):
    live = overrides(proxy_cache, "system=gpu_only", "trace.record=true")
    run_job(compose_checked(live), tmp_path / "live")
    bad = overrides(proxy_cache, "system=gpu_only", "source=trace", f"trace.path={tmp_path / 'live' / 'trace.npz'}")
    bad = [o if o != "model=tiny" else "model=mini" for o in bad]
    with pytest.raises(HarnessError, match="MoE layers"):
        run_job(compose_checked(bad), tmp_path / "replay")


def test_replay_without_calibration_beside_the_trace(proxy_cache, tmp_path, tiny_dir):
    run_job(compose_checked(overrides(proxy_cache, "system=gpu_only", "trace.record=true")), tmp_path / "live")
    (tmp_path / "live" / "calibration.npz").unlink()
    cfg = compose_checked(overrides(proxy_cache, "system=tide", "source=trace",
                                    f"trace.path={tmp_path / 'live' / 'trace.npz'}"))
    with pytest.raises(HarnessError, match="calibration"):
        run_job(cfg, tmp_path / "replay")
