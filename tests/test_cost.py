"""The cost model: rooflines, the measured CPU table, copies, non-expert work, the layer
combine rule and its forward timeline, the hardware YAMLs, and local profiling."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import harness.profiling as profiling
from harness.cost import (
    CostModel,
    ForwardTimeline,
    HardwareConfig,
    expert_shape,
    load_hardware,
)
from harness.errors import HarnessError
from harness.model.config import LLaDA2Config

CONF = Path(__file__).resolve().parents[1] / "conf" / "hardware"
MINI = LLaDA2Config.published("llada2_mini")
TINY = LLaDA2Config(hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3)


@pytest.fixture
def a100() -> CostModel:
    return CostModel(MINI, HardwareConfig())


def test_gpu_expert_roofline_memory_then_compute_bound(a100: CostModel) -> None:
    hw = a100.hw
    expert_bytes = 2 * 3 * 2048 * 512
    memory_bound = hw.gpu_call_overhead_us * 1e-6 + expert_bytes / (hw.gpu_hbm_gbps * 1e9)
    assert a100.gpu_expert_time(1) == pytest.approx(memory_bound)
    assert a100.gpu_expert_time(100) == a100.gpu_expert_time(1)  # below the ridge: weights dominate
    n = 4096
    compute_bound = hw.gpu_call_overhead_us * 1e-6 + 2 * 3 * 2048 * 512 * n / (hw.gpu_bf16_tflops * 1e12)
    assert a100.gpu_expert_time(n) == pytest.approx(compute_bound)
    assert a100.gpu_expert_time(0) == 0.0


def test_cpu_expert_roofline_and_vector_forms_agree(a100: CostModel) -> None:
    hw = a100.hw
    expected = hw.cpu_call_overhead_us * 1e-6 + 2 * 3 * 2048 * 512 / (hw.cpu_mem_gbps * 1e9)
    assert a100.cpu_expert_time(1) == pytest.approx(expected)
    loads = torch.tensor([0, 1, 3, 50, 161, 162, 900])
    assert a100.gpu_expert_times(loads).tolist() == [a100.gpu_expert_time(int(n)) for n in loads]
    assert a100.cpu_expert_times(loads).tolist() == [a100.cpu_expert_time(int(n)) for n in loads]


def test_measured_cpu_table_is_interpolated_extrapolated_and_monotone() -> None:
    hw = HardwareConfig(
        cpu_table_shape=expert_shape(MINI), cpu_table_tokens=[1, 2, 4], cpu_table_seconds=[1e-3, 1.5e-3, 3e-3]
    )
    cost = CostModel(MINI, hw)
    assert cost.cpu_expert_time(1) == pytest.approx(1e-3)
    assert cost.cpu_expert_time(3) == pytest.approx(2.25e-3)
    assert cost.cpu_expert_time(8) == pytest.approx(3e-3 + 0.75e-3 * 4)  # last slope
    noisy = CostModel(MINI, replace(hw, cpu_table_seconds=[1e-3, 0.8e-3, 3e-3]))
    assert noisy.cpu_expert_time(2) == pytest.approx(0.8e-3)  # never cheaper with more tokens:
    assert noisy.cpu_expert_time(1) == pytest.approx(0.8e-3)  # the 1-token row was the noisy one
    with pytest.raises(HarnessError, match="cpu_table_shape"):
        CostModel(LLaDA2Config.published("llada2_flash"), hw)


def test_copy_time_is_linear_in_experts(a100: CostModel) -> None:
    one = 2 * 3 * 2048 * 512 / 25e9 + 10e-6
    assert a100.copy_time(1) == pytest.approx(one)
    assert a100.copy_time(3) == pytest.approx(3 * one)
    assert a100.copy_time(0) == 0.0


def test_non_expert_time_grows_with_tokens_and_context(a100: CostModel) -> None:
    base = a100.non_expert_time(32, 32)
    assert base > 0
    assert a100.non_expert_time(32, 4096) > base
    assert a100.non_expert_time(2048, 2048) > base
    parts = a100.non_expert_breakdown(32, 32)
    assert parts.total == pytest.approx(base)
    assert parts.n_moe_layers == MINI.n_moe_layers
    flash = CostModel(LLaDA2Config.published("llada2_flash"), HardwareConfig())
    assert flash.non_expert_time(32, 32) > base


def test_combine_is_max_with_overlap_and_sum_without(a100: CostModel) -> None:
    assert a100.combine(gpu_s=2.0, sync_copy_s=1.0, cpu_s=2.5, overlap=True) == 3.0
    assert a100.combine(gpu_s=2.0, sync_copy_s=1.0, cpu_s=2.5, overlap=False) == 5.5
    # async copies hide behind the layer; only the part that outlasts it is added
    assert a100.combine(2.0, 1.0, 0.0, overlap=True, async_copy_s=1.5) == 3.0
    assert a100.combine(2.0, 1.0, 0.0, overlap=True, async_copy_s=4.0) == 5.0


def _timeline(cost: CostModel) -> ForwardTimeline:
    line = ForwardTimeline(cost, 32, 32)
    line.clock = 0.0
    line.parts = replace(line.parts, before_moe=0.0, per_moe_layer=0.0, head=0.0)
    line.layers_charged = line.parts.n_moe_layers
    return line


def test_timeline_single_layer_matches_combine(a100: CostModel) -> None:
    for overlap in (True, False):
        line = _timeline(a100)
        timing = line.charge_layer(
            0, gpu_s=1e-3, cpu_s=2e-3, n_sync=2, gpu_experts=[1], async_targets=[(0, 5)], overlap=overlap
        )
        total = line.finish()
        c = a100.copy_time(1)
        assert total == pytest.approx(a100.combine(1e-3, 2 * c, 2e-3, overlap, async_copy_s=c))
        assert timing.copies_s + timing.gpu_s + timing.cpu_s == pytest.approx(timing.total_s)


def test_timeline_prefetch_wait_and_fifo_link(a100: CostModel) -> None:
    c = a100.copy_time(1)
    line = _timeline(a100)
    # layer 0 computes for 0.5 copies' time and prefetches two experts into layer 1
    line.charge_layer(
        0, gpu_s=0.5 * c, cpu_s=0.0, n_sync=0, gpu_experts=[0], async_targets=[(1, 7), (1, 8)], overlap=False
    )
    # layer 1 uses expert 8, which lands at 2c: it waits 1.5c
    timing = line.charge_layer(
        1, gpu_s=0.1 * c, cpu_s=0.0, n_sync=0, gpu_experts=[8], async_targets=[], overlap=False
    )
    assert timing.copies_s == pytest.approx(1.5 * c)
    line2 = _timeline(a100)
    line2.charge_layer(0, 0.5 * c, 0.0, 0, [0], [(1, 7), (1, 8)], overlap=False)
    # a sync copy in layer 1 queues behind both prefetches: done at 3c, waited 2.5c
    timing2 = line2.charge_layer(1, 0.1 * c, 0.0, 1, [3], [], overlap=False)
    assert timing2.copies_s == pytest.approx(2.5 * c)
    # unused prefetches still have to land before the forward ends
    line3 = _timeline(a100)
    line3.charge_layer(0, 0.5 * c, 0.0, 0, [0], [(1, 7), (1, 8)], overlap=False)
    assert line3.finish() == pytest.approx(2 * c)
    assert line3.drain_s == pytest.approx(1.5 * c)


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_hardware_yaml_keys_match_the_schema(path: Path) -> None:
    raw = OmegaConf.load(path)
    assert set(raw.keys()) == {f.name for f in fields(HardwareConfig)}
    assert raw.name == path.stem
    merged = OmegaConf.merge(OmegaConf.structured(HardwareConfig), raw)
    hw = OmegaConf.to_object(merged)
    assert isinstance(hw, HardwareConfig)
    CostModel(MINI, hw)


def test_the_default_profile_is_the_a100_one() -> None:
    assert HardwareConfig().name == "a100_pcie4"
    a100 = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(HardwareConfig), OmegaConf.load(CONF / "a100_pcie4.yaml"))
    )
    assert a100 == HardwareConfig()


def test_invalid_hardware_values_are_one_line_errors() -> None:
    with pytest.raises(HarnessError, match=r"hardware\.pcie_gbps"):
        CostModel(MINI, HardwareConfig(pcie_gbps=0))
    with pytest.raises(HarnessError, match=r"hardware\.cpu_call_overhead_us"):
        CostModel(MINI, HardwareConfig(cpu_call_overhead_us=-1))


def test_load_hardware_returns_static_profiles_unchanged() -> None:
    hw = HardwareConfig(name="h", pcie_gbps=50.0)
    assert load_hardware(hw, MINI) is hw
    composed = OmegaConf.merge(OmegaConf.structured(HardwareConfig), {"name": "h", "pcie_gbps": 50.0})
    assert load_hardware(OmegaConf.to_object(composed), MINI) == hw


def test_local_profile_is_measured_once_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "hw" / "local.json"
    cfg = HardwareConfig(name="local", profile_path=str(path), profile_if_missing=True)
    hw = load_hardware(cfg, TINY)
    assert path.exists()
    assert hw.cpu_table_tokens == [1, 2, 4, 8, 16, 32, 64]
    assert len(hw.cpu_table_seconds) == 7 and all(s > 0 for s in hw.cpu_table_seconds)
    assert hw.cpu_table_shape == expert_shape(TINY)
    assert "cpu" in hw.measured
    # the CPU charge now comes from the measured table
    cost = CostModel(TINY, hw)
    assert cost.cpu_expert_time(1) == pytest.approx(max(hw.cpu_table_seconds[0], 0.0))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("profiled twice")

    monkeypatch.setattr(profiling, "profile_local", refuse)
    assert load_hardware(cfg, TINY) == hw
    stored = json.loads(path.read_text())
    assert expert_shape(TINY) in stored["shapes"]


def test_missing_profile_without_permission_is_an_error(tmp_path: Path) -> None:
    cfg = HardwareConfig(name="local", profile_path=str(tmp_path / "none.json"), profile_if_missing=False)
    with pytest.raises(HarnessError, match="profile_if_missing"):
        load_hardware(cfg, TINY)


def test_profile_local_adds_shapes_to_one_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    profiling.profile_local(TINY, path, reps=1)
    other = LLaDA2Config(hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3)
    profile = profiling.profile_local(other, path, reps=1)
    assert set(profile["shapes"]) == {expert_shape(TINY), expert_shape(other)}


def test_a_noisy_small_token_measurement_does_not_raise_the_rest_of_the_cpu_table() -> None:
    # 24 ms at 1-2 tokens is a disturbed measurement: 4 tokens took 40 us, and 1 token can be padded to 4
    raw = [24e-3, 24e-3, 40e-6, 45e-6, 63e-6, 180e-6, 170e-6]
    assert profiling.suffix_min(raw) == [40e-6, 40e-6, 40e-6, 45e-6, 63e-6, 170e-6, 170e-6]
    assert profiling.suffix_min([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]  # an orderly table is kept as measured


def test_profile_local_warns_and_repairs_a_noisy_table(tmp_path: Path, monkeypatch, capsys) -> None:
    table = [5e-3, 1e-4, 2e-4, 3e-4, 4e-4, 5e-4, 6e-4]
    monkeypatch.setattr(profiling, "_expert_latency", lambda g, tokens, reps: table)
    profile = profiling.profile_local(TINY, tmp_path / "p.json", reps=1)
    entry = profile["shapes"][expert_shape(TINY)]
    assert entry["cpu_table_seconds"][0] == 1e-4 and entry["cpu_table_seconds_raw"][0] == 5e-3
    assert "at [1] tokens" in capsys.readouterr().err


@pytest.mark.parametrize("profile", ["a100", "table", "slow_gpu"])
def test_expert_totals_are_the_bits_of_the_torch_sums(profile: str) -> None:
    """gpu_expert_total / cpu_expert_total (the engine's per-layer charge) equal summing
    the vector functions' tensors in torch, bit for bit: constant runs (memory-bound
    experts), mixed runs, zeros, negatives and loads past the first table."""
    hw = {
        "a100": HardwareConfig(),
        "table": HardwareConfig(cpu_table_shape=expert_shape(MINI), cpu_table_tokens=[1, 2, 4, 16],
                                cpu_table_seconds=[3e-4, 3.5e-4, 6e-4, 2e-3]),
        "slow_gpu": HardwareConfig(gpu_bf16_tflops=0.5),
    }[profile]
    cost = CostModel(MINI, hw)
    gen = torch.Generator().manual_seed(0)
    cases = [torch.zeros(0, dtype=torch.long), torch.tensor([0, 0]), torch.tensor([-3, 2, 5]), torch.tensor([4000])]
    for k in (1, 2, 3, 7, 8, 9, 31, 64, 100, 165, 256):
        for high in (2, 8, 40, 300, 1000):
            cases.append(torch.randint(1, high, (k,), generator=gen))
    for loads in cases:
        assert cost.gpu_expert_total(loads.numpy()) == float(cost.gpu_expert_times(loads).sum())
        assert cost.cpu_expert_total(loads.numpy()) == float(cost.cpu_expert_times(loads).sum())
