"""The hybrid executor (harness/hybrid) through its CPU stand-in for the device: every
system decodes the gpu_only tokens through the real executor path, the slot pools hold at
most B experts, every routed expert is computed once on the side its plan named, copies
are waited on before the GPU uses them (and async ones not by the layer that issued
them), scratch copies never become resident; the backend switch; the run wiring; and
CUDA-only checks that skip here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import harness.job.live
import harness.model.experts as experts_module
from harness.accounting.cost import CostModel, HardwareConfig
from harness.accounting.profiling import fit_gpu_roofline
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.decode.decode_batch import decode_prompts, decode_with_engine
from harness.engine.engine import OffloadEngine
from harness.hybrid.attach import attach
from harness.hybrid.backend import check_backend, resolve_backend
from harness.hybrid.device import Op, StandInRuntime
from harness.hybrid.executor import HybridExecutor, wrap
from harness.hybrid.pool import SlotPool
from harness.job.config import register_configs
from harness.job.execution import Execution, apply_measured
from harness.job.live import run_job
from harness.model.config import LLaDA2Config
from harness.model.proxy import proxy_config
from harness.placement.plan import move_count, move_ids
from harness.placement.trace import RoutingTrace
from harness.results.run_result import RunIdentity, RunResult
from systems.registry import make_system
from tests import process_wait
from tests.harness_cli import REPO, TINY, run_module
from tests.hybrid_recording import (
    CALIBRATION,
    PROMPTS,
    SETTINGS,
    VARIANTS,
    B,
    Recording,
    calls_of,
    load_tiny,
    order_violations,
    record_run,
)

register_configs()

@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> list[list[int]]:
    """gpu_only numerics: every expert computed in place by the plain engine."""
    return [o.generated for o in decode_prompts(load_tiny(tiny_dir), PROMPTS, SETTINGS).outputs]


@pytest.fixture(scope="module")
def calibration(tiny_dir: Path) -> RoutingTrace:
    loaded = load_tiny(tiny_dir)
    g = loaded.nominal
    trace = RoutingTrace(g.n_moe_layers, g.num_experts, geometry=g.to_dict())
    engine = OffloadEngine(make_system("gpu_only", {}), g, g.num_experts, CostModel(g, HardwareConfig()), trace=trace)
    engine.prepare(None, SETTINGS.steps)
    decode_with_engine(loaded, engine, CALIBRATION, SETTINGS, desc="calibration")
    return trace


@pytest.fixture(scope="module")
def runs(tiny_dir: Path, calibration: RoutingTrace) -> dict[str, Recording]:
    return {variant: record_run(tiny_dir, calibration, variant) for variant in VARIANTS}




def ids(mask: np.ndarray) -> list[int]:
    return np.flatnonzero(mask).tolist()


# ---- what the executor computes --------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_system_decodes_the_gpu_only_tokens_through_the_executor(runs, reference, variant) -> None:
    assert runs[variant].tokens == reference


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_routed_expert_is_computed_once_on_the_side_its_plan_named(runs, variant) -> None:
    rec = runs[variant]
    assert rec.calls, "the executor ran no MoE layer"
    for call in rec.calls:
        gpu = sorted(e for side, e in call.computed if side in ("gpu", "scratch"))
        cpu = sorted(e for side, e in call.computed if side == "cpu")
        assert gpu == ids(call.plan.gpu), f"layer {call.layer}"
        assert cpu == ids(call.plan.cpu), f"layer {call.layer}"
        assert sorted(e for side, e in call.computed if side == "scratch") == move_ids(call.plan.scratch).tolist()


def test_the_variants_exercise_every_kind_of_move(runs) -> None:
    """Guards the tests above against vacuity: each mechanism really happened."""
    tags = {v: {op.tag for op in rec.ops if op.kind == "copy"} for v, rec in runs.items()}
    assert {"sync", "scratch", "prefetch"} <= tags["mixtral_offload+prefetch"]
    assert "scratch" in tags["fiddler+scratch"]
    assert "async" in tags["tide+async"] and "sync" in tags["tide+sync"]
    assert any(call.plan.cpu.any() for call in runs["tide+async"].calls)
    assert any(call.plan.cpu.any() for call in runs["fiddler"].calls)


# ---- device memory -----------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_slot_pools_never_hold_more_than_the_budget(runs, variant) -> None:
    rec = runs[variant]
    capacity = rec.engine.capacity
    assert capacity == (256 if variant == "gpu_only" else B)
    summary = rec.executor.summary()
    assert summary["gpu_slots_high_water"] <= capacity
    assert all(len(call.resident_after) <= capacity for call in rec.calls)
    expert_bytes = sum(v.numel() * v.element_size() for v in rec.executor.placement.host[0].views[0])
    n_layers = len(rec.executor.placement.host)
    # preallocated once, never grown: exactly B slots per layer are ever on the device
    assert rec.runtime.peak["pool"] == summary["gpu_expert_pool_bytes"] == n_layers * capacity * expert_bytes


@pytest.mark.parametrize("variant", ["fiddler+scratch", "mixtral_offload+prefetch", "oracle"])
def test_scratch_copies_are_freed_with_their_layer_and_never_become_resident(runs, variant) -> None:
    rec = runs[variant]
    with_scratch = [call for call in rec.calls if move_count(call.plan.scratch)]
    assert with_scratch and rec.runtime.peak["scratch"] > 0
    for call in with_scratch:
        assert not set(move_ids(call.plan.scratch).tolist()) & call.resident_after
    assert all(call.scratch_bytes_after == 0 for call in rec.calls)


def test_a_full_pool_refuses_another_expert() -> None:
    runtime = StandInRuntime()
    like = experts_module.ExpertWeights(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(4, 2))
    pool = SlotPool(runtime, 0, 2, like)
    pool.load(0, like, "sync")
    pool.load(1, like, "sync")
    with pytest.raises(RuntimeError, match="slots are taken"):
        pool.load(2, like, "sync")
    pool.evict(0)
    pool.load(2, like, "sync")
    assert pool.holds() == {1, 2} and pool.high_water == 2


def test_expert_parallel_runs_are_refused_on_the_device(tiny_dir) -> None:
    from harness.accounting.topology import Topology

    loaded = load_tiny(tiny_dir)
    placement = attach(loaded.model, StandInRuntime())
    g = loaded.nominal
    engine = OffloadEngine(make_system("ep_linear", {}), g, B, CostModel(g, HardwareConfig()),
                           topology=Topology("multi", (1.0, 1.0)))
    engine.prepare(None, SETTINGS.steps)
    with pytest.raises(HarnessError, match="topology=multi"):
        HybridExecutor(engine, placement)


# ---- order of copies, waits and compute ------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_copies_are_waited_on_before_the_gpu_uses_them(runs, variant) -> None:
    assert order_violations(runs[variant].ops) == []


def test_the_order_check_finds_a_missing_wait_and_a_waited_async_copy() -> None:
    ops = [Op("plan", 0), Op("copy", 0, (5,), 0, "sync"), Op("gpu", 0, (5,)), Op("combine", 0),
           Op("plan", 1), Op("copy", 1, (6,), 1, "async"), Op("wait", 1, (), 1), Op("combine", 1)]
    assert len(order_violations(ops)) == 2


@pytest.mark.parametrize("variant", ["fiddler", "tide+sync", "tide+async", "oracle"])
def test_the_layer_joins_cpu_and_gpu_before_its_one_combine(runs, variant) -> None:
    rec = runs[variant]
    overlap = rec.engine.system.overlap
    checked = 0
    for call in calls_of(rec.ops):
        kinds = [op.kind for op in call]
        assert kinds.count("combine") == 1 and kinds[-1] == "combine"
        if "cpu_start" not in kinds:
            continue
        checked += 1
        assert kinds.index("cpu_done") < kinds.index("join") < kinds.index("combine")
        if "gpu" in kinds:
            if overlap:  # the CPU starts before the GPU experts are launched
                assert kinds.index("cpu_start") < kinds.index("gpu") < kinds.index("join")
            else:  # one after the other, as the system's execution model says
                assert kinds.index("gpu") < kinds.index("wait_compute") < kinds.index("cpu_start")
    assert checked > 0


def test_a_missing_wait_shows_up_as_different_tokens(tiny_dir, calibration, reference, monkeypatch) -> None:
    """The stand-in's copies land only when waited on: an executor that skipped the wait
    would compute with stale slots, so the lossless test above can fail."""

    def no_wait(self: SlotPool, expert: int) -> experts_module.ExpertWeights:
        self.landing.pop(self.slot_of[expert], None)
        return self._view(self.slot_of[expert])

    monkeypatch.setattr(SlotPool, "weights", no_wait)
    # tide's refreshes reload slots that its GPU experts then read (on the balanced tiny
    # proxy, mixtral_offload's prefetches happen not to be read stale with a different result)
    assert record_run(tiny_dir, calibration, "tide+sync").tokens != reference


# ---- timing records ------------------------------------------------------------------------
def test_each_step_records_measured_beside_modeled_time(runs) -> None:
    rec = runs["tide+async"]
    series = rec.engine.step_series
    assert len(series) == len(rec.executor.steps) > 0
    assert all(s["measured_s"] > 0 and s["modeled_latency_s"] > 0 for s in series)
    assert all(s["measured_cpu_experts_s"] >= 0 for s in series)
    summary = rec.executor.summary()
    assert summary["measured_time_s"] == pytest.approx(sum(s["measured_s"] for s in series))


def test_apply_measured_makes_tokens_per_s_measured_and_keeps_the_modeled_rate() -> None:
    result = RunResult(RunIdentity(backend="cpu"), metrics={"tokens_per_s": 50.0, "generated_tokens": 20})
    apply_measured(result, {"measured_time_s": 4.0, "gpu_peak_mem_bytes": 10}, "cuda")
    assert result.timing.kind == "measured" and result.identity.backend == "cuda"
    assert result.metrics["tokens_per_s"] == 5.0 and result.metrics["modeled_tokens_per_s"] == 50.0
    assert result.timing.figures == {"measured_time_s": 4.0, "gpu_peak_mem_bytes": 10}
    assert result["metrics"]["gpu_peak_mem_bytes"] == 10  # result.json's flat metrics


def test_the_fitted_gpu_roofline_reproduces_both_ends_of_the_measured_table() -> None:
    g = LLaDA2Config.published("llada2_mini")
    tokens, seconds = [1, 64, 4096], [30e-6, 35e-6, 400e-6]
    fitted = fit_gpu_roofline(g, tokens, seconds, hbm_gbps=3000.0)
    cost = CostModel(g, HardwareConfig(**fitted))
    assert cost.gpu_expert_time(1) == pytest.approx(seconds[0])
    assert cost.gpu_expert_time(4096) == pytest.approx(seconds[-1])


# ---- the backend switch and the run wiring ---------------------------------------------------
def test_backend_auto_is_cpu_without_a_gpu_and_unknown_backends_are_refused() -> None:
    assert resolve_backend("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_backend("cpu") == "cpu"
    with pytest.raises(HarnessError, match="backend='tpu' is not allowed"):
        check_backend("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.slow
def test_backend_cuda_without_a_gpu_exits_2_with_one_line(tmp_path) -> None:
    proc = run_module("harness", [*TINY, "backend=cuda", "tracking.enabled=false"], tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "backend=cuda needs a CUDA GPU" in lines[0]


def test_a_cpu_run_records_its_backend_and_modeled_timing(proxy_cache, tmp_path, tiny_dir) -> None:
    cfg = compose_checked([*TINY, "system=gpu_only", f"cache_dir={proxy_cache}", "tracking.enabled=false",
                           "backend=cpu"])
    result = run_job(cfg, tmp_path)
    assert result["backend"] == "cpu" and result["timing"] == "modeled"
    assert "measured_time_s" not in result["metrics"]


def test_a_device_run_goes_through_the_executor_with_a_per_backend_reference(tmp_path, tiny_dir, monkeypatch):
    """run_live with backend=standin (the cuda path, the CPU playing the device): calibration,
    the all-GPU reference and the system all run through executors; the result is measured."""
    cache = tmp_path / "cache"
    (cache / "proxies").mkdir(parents=True)
    (cache / "proxies" / tiny_dir.name).symlink_to(tiny_dir)
    closed: list[str] = []
    close = HybridExecutor.close

    def closing(self: HybridExecutor) -> None:
        closed.append(self.engine.system.name)
        close(self)

    monkeypatch.setattr(HybridExecutor, "close", closing)
    cfg = compose_checked([*TINY, "system=fiddler", f"cache_dir={cache}", "tracking.enabled=false",
                           "backend=standin", "timing.warmup=1", "timing.repeats=2"])
    result = run_job(cfg, tmp_path / "run")
    m = result["metrics"]
    assert result["timing"] == "measured" and result["backend"] == "standin"
    assert m["host_experts_pinned"] == 1 and m["host_expert_bytes"] > 0
    # the planner's and the harness's host time are inside the measured time
    assert m["measured_host_plan_s"] > 0 and m["measured_host_engine_s"] > 0
    assert m["measured_host_plan_s"] + m["measured_host_engine_s"] < m["measured_time_s"]
    assert m["lossless"] == 1 and m["token_match_rate"] == 1.0
    # one warm-up decode, two measured: tokens/s is the median rate of the two repeats
    assert m["measured_warmup"] == 1 and m["measured_repeats"] == 2
    assert m["measured_time_s_p50"] <= m["measured_time_s_p90"]
    assert m["tokens_per_s"] == m["measured_tokens_per_s_p50"] <= m["measured_tokens_per_s_p90"]
    last = m["measured_time_s"]  # the last repeat's time; the median of two gives the other one
    other = 2 * m["measured_time_s_p50"] - last
    low, high = sorted([last, other])
    assert other > 0 and m["measured_time_s_p90"] == pytest.approx(low + 0.9 * (high - low))
    assert m["modeled_tokens_per_s"] == pytest.approx(m["generated_tokens"] / m["modeled_time_s"])
    assert all("measured_s" in s for s in result["step_series"])
    prompts = harness.job.live.load_prompts(cfg.workload, cfg.limit_prompts)
    cpu_key = harness.job.live.artifact_key(cfg, cfg.decode, prompts)
    assert len(list((cache / "reference").iterdir())) == 1  # the stand-in's own, not the cpu backend's
    assert cpu_key not in {p.stem for p in (cache / "reference").iterdir()}
    # calibration, reference, then the run's warm-up and two repeats: all on the device
    assert closed == ["gpu_only", "gpu_only", "fiddler", "fiddler", "fiddler"]
    on_disk = json.loads((tmp_path / "run" / "result.json").read_text())
    assert on_disk["timing"] == "measured"


# ---- CUDA only ----------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cuda_run(tiny_dir: Path, calibration: RoutingTrace | None, name: str, options: dict, budget: int
             ) -> tuple[list[list[int]], dict[str, Any], OffloadEngine]:
    from harness.hybrid.device import CudaRuntime

    loaded = load_tiny(tiny_dir)
    attach(loaded.model, CudaRuntime())
    g = loaded.nominal
    system = make_system(name, options)
    engine = OffloadEngine(system, g, budget, CostModel(g, HardwareConfig()))
    engine.prepare(calibration if system.needs_calibration else None, SETTINGS.steps)
    executor = wrap(loaded.model, engine)
    batch = decode_with_engine(loaded, executor, PROMPTS, SETTINGS, desc=name)
    executor.close()
    return [o.generated for o in batch.outputs], executor.summary(), engine


@cuda
@pytest.mark.cuda
def test_cuda_all_gpu_systems_match_gpu_only_bit_for_bit(tiny_dir, calibration) -> None:
    """mixtral_offload computes every expert on the GPU from slot copies: the same kernels on
    the same inputs as gpu_only, so any difference means a copy was read before it landed."""
    reference, _, _ = cuda_run(tiny_dir, None, "gpu_only", {}, 256)
    tokens, summary, engine = cuda_run(tiny_dir, None, "mixtral_offload", {"prefetch": True, "prefetch_k": 4}, B)
    assert tokens == reference
    assert engine.summary()["copies_async"] > 0 and summary["gpu_slots_high_water"] <= B


@cuda
@pytest.mark.cuda
def test_cuda_pools_are_the_only_expert_memory_on_the_device(tiny_dir, calibration) -> None:
    _, summary, _ = cuda_run(tiny_dir, calibration, "tide", {"tau": 2, "migration": "async"}, B)
    g = proxy_config("tiny")
    expert_bytes = 3 * g.hidden_size * g.moe_intermediate_size * 2  # bf16 on the device
    assert summary["gpu_expert_pool_bytes"] == g.n_moe_layers * B * expert_bytes
    assert summary["gpu_peak_mem_bytes"] > 0
    assert summary["measured_time_s"] > 0 and summary["measured_gpu_span_s"] > 0


@cuda
@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_run_records_measured_timing_and_peak_memory(tmp_path) -> None:
    proc = run_module("harness", [*TINY, "system=tide", "backend=cuda", "tracking.enabled=false",
                                  f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    m = result["metrics"]
    assert result["timing"] == "measured" and result["backend"] == "cuda"
    assert m["gpu_peak_mem_bytes"] > 0 and m["modeled_tokens_per_s"] > 0 and 0 <= m["token_match_rate"] <= 1


@cuda
@pytest.mark.cuda
def test_cuda_local_profile_measures_the_gpu(tmp_path) -> None:
    from harness.accounting.profiling import profile_local

    g = proxy_config("tiny")
    entry = profile_local(g, tmp_path / "local.json", reps=1)["shapes"][f"{g.hidden_size}x{g.moe_intermediate_size}"]
    assert all(v > 0 for k, v in entry["gpu"].items() if k not in ("gpu_call_overhead_us", "pcie_latency_us"))
    assert len(entry["gpu_table_seconds"]) == len(entry["gpu_table_tokens"]) > 2


def test_the_gpu_check_script_parses() -> None:
    script = REPO / "scripts" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.e2e
def test_the_gpu_check_script_runs_end_to_end_on_the_stand_in(tmp_path) -> None:
    """The prepared GPU script, dry-run with the CPU playing the device: every step it takes
    on a GPU (hardware=local, gpu_only first as the reference, a system, the summary)."""
    env = {**os.environ, "BACKEND": "standin", "MODEL": "tiny", "SYSTEMS": "gpu_only tide", "CUDA_TESTS": "0",
           "OUT": str(tmp_path / "out")}
    done = process_wait.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], "scripts/gpu_check.sh", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    cut = [line for line in done.stdout.splitlines() if "timed out" in line]
    assert not cut, f"a step of scripts/gpu_check.sh timed out: {cut[0]}"
    rows = [line.split("\t") for line in (tmp_path / "out" / "summary.tsv").read_text().splitlines()
            if not line.startswith("#")]
    header, body = rows[0], {row[0]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    assert header[:3] == ["system", "timing", "tokens_per_s"] and set(body) == {"gpu_only", "tide"}
    for row in body.values():
        assert row["timing"] == "measured" and row["token_match_rate"] == "1"
    assert float(body["tide"]["miss_rate"]) > 0 and int(body["tide"]["cpu_expert_tokens"]) > 0
    assert json.loads((tmp_path / "out" / "local_profile.json").read_text())["shapes"]


def test_the_backend_is_chosen_once_into_an_execution() -> None:
    host, device = Execution.choose("cpu"), Execution.choose("standin")
    assert not host.on_device and host.cache_key("key") == "key"  # the host's artifacts keep their keys
    assert device.on_device and device.cache_key("key") not in ("key", host.cache_key("key"))
    with pytest.raises(HarnessError, match="backend='tpu' is not allowed"):
        Execution.choose("tpu")
