"""The cost model: rooflines, the measured CPU table, copies, non-expert work, the layer
combine rule (its forward timeline: tests/unit/test_ledger.py, tests/kernels/test_clock_kernel.py), the
hardware YAMLs, and local profiling."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import harness.accounting.profiling as profiling
from harness.accounting.cost import (
    CostModel,
    HardwareConfig,
    expert_shape,
)
from harness.accounting.profiling import load_hardware
from harness.common.errors import HarnessError
from harness.model.config import LLaDA2Config
from tests.conftest import REPO

CONF = REPO / "conf" / "hardware"
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
    assert replace(a100, sources={}) == HardwareConfig()  # the YAML adds where each figure comes from


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
