"""Sourced hardware profiles: every constant of every conf/hardware profile names its source,
result.json lists the estimated ones, and `python -m harness.profile` measures this machine
(here: its CPU, on a tiny expert shape) into a profile that a run accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from harness.accounting.cost import SOURCE_KINDS, SOURCED_CONSTANTS, CostModel, HardwareConfig, expert_shape
from harness.accounting.profiling import load_hardware
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.profile import main as profile_main
from harness.profile import tile_record, tile_tokens
from harness.results.run_result import RunResult
from harness.zoo.entry import nominal_geometry
from tests.conftest import REPO

register_configs()

CONF = REPO / "conf" / "hardware"
GOLDEN = REPO / "tests" / "golden" / "mini"


def profile(name: str) -> HardwareConfig:
    merged = OmegaConf.merge(OmegaConf.structured(HardwareConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    return OmegaConf.to_object(merged)


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_every_constant_of_every_profile_names_its_source(name):
    hw = profile(name)
    for constant in SOURCED_CONSTANTS:
        source = hw.sources.get(constant, "")
        assert source.split(":")[0].split(" ")[0] in SOURCE_KINDS, (constant, source)
        if source.startswith(("datasheet", "benchmark")):
            assert re.search(r"https?://", source), (constant, "a datasheet or benchmark is cited by its URL")
    assert set(hw.sources) <= {*SOURCED_CONSTANTS, "cpu_table_seconds", "pcie_pageable_gbps"}


def test_the_estimates_are_the_constants_sourced_as_estimates():
    a100 = profile("a100_pcie4")
    assert set(a100.estimates()) == {"gpu_call_overhead_us", "pcie_latency_us", "cpu_mem_gbps", "cpu_tflops",
                                     "cpu_call_overhead_us"}
    assert HardwareConfig().estimates()["pcie_gbps"] == "no source given"  # unsourced counts as estimated


def test_result_json_lists_the_estimated_constants(tmp_path):
    overrides = ["model=mini", "model.weights=random", "decode.gen_length=32", "source=trace",
                 f"trace.path={GOLDEN / 'trace.npz'}", "tracking.enabled=false", "system=fiddler",
                 f"cache_dir={tmp_path / 'cache'}"]
    run_job(compose_checked(overrides), tmp_path)
    result = RunResult.from_json(tmp_path / "result.json")
    assert set(result.hardware_estimates) == set(profile("a100_pcie4").estimates())
    assert result.hardware_estimates["cpu_tflops"].startswith("estimate:")


def test_tile_tokens_hold_the_tile_boundaries():
    assert tile_tokens(256) == [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
    assert tile_tokens(40) == [1, 2, 4, 8, 16, 32, 40]
    with pytest.raises(HarnessError, match="max_tokens"):
        tile_tokens(0)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, Path]:
    """This machine's CPU profiled for the tiny model's expert shape (small shapes: seconds)."""
    root = tmp_path_factory.mktemp("profile")
    out, table = root / "box.yaml", root / "local.json"
    assert profile_main(["model=tiny", f"out={out}", f"json={table}", "max_tokens=32", "dense_max=12", "reps=1",
                         "name=box"]) == 0
    return out, table


def test_the_profile_holds_a_measured_cpu_table_with_its_source(measured):
    out, _ = measured
    data = yaml.safe_load(out.read_text())
    hw = HardwareConfig(**data)
    assert hw.name == "box" and hw.cpu_table_tokens == [1, 2, 4, 8, 16, 32]
    assert all(s > 0 for s in hw.cpu_table_seconds)
    assert hw.sources["cpu_table_seconds"].startswith("measured on ")
    assert "python -m harness.profile model=tiny" in hw.sources["cpu_table_seconds"]
    for constant in ("cpu_mem_gbps", "cpu_tflops", "cpu_call_overhead_us"):  # fitted to the measurements
        assert hw.sources[constant].startswith("measured on ")
    details = yaml.safe_load(Path(f"{out}.json").read_text())  # JSON is YAML
    assert details["dense_check"]["tokens"] == [n for n in range(1, 13) if n not in (1, 2, 4, 8)]
    assert details["host_memory_gbps"] > 0
    if not torch.cuda.is_available():  # the tile needs a GPU: not measured, the default kept, and said
        assert details["gemm_tile"]["measured"] is False and details["gemm_tile"]["tile"] == hw.gpu_gemm_tile == 64
        assert "cannot be measured" in details["gemm_tile"]["note"]
        assert "gpu_gemm_tile" not in hw.sources


@pytest.mark.parametrize(("tile", "charged"), [(32, 32), (None, 64)])
def test_a_measured_tile_is_what_the_profile_charges(tile, charged, tmp_path):
    """A GPU profile's entry (hand-made: no GPU here) with a batched-matmul sweep: its
    detected tile becomes hardware.gpu_gemm_tile, with its source; no staircase keeps 64."""
    geometry = nominal_geometry(compose_checked(["model=tiny"]).model)
    sweep = {"tokens": [256, 257], "seconds": [1e-5, 1e-5], "tile": tile, "groups": 8, "shape": "bmm"}
    entry = {"cpu_table_tokens": [1, 2], "cpu_table_seconds": [1e-4, 2e-4], "command": "python -m harness.profile",
             "gpu": None, "gemm_tile": sweep, "gpu_name": "a GPU"}
    table = tmp_path / "local.json"
    table.write_text(json.dumps({"version": 1, "host": "box", "shapes": {expert_shape(geometry): entry}}))
    hw = load_hardware(HardwareConfig(profile_path=str(table)), geometry)
    assert hw.gpu_gemm_tile == charged
    assert ("gpu_gemm_tile" in hw.sources) == (tile is not None)
    record = tile_record(entry, hw.gpu_gemm_tile)
    assert record["measured"] == (tile is not None) and record["tile"] == charged
    assert ("show no staircase" in record["note"]) == (tile is None)


def test_a_run_accepts_the_profile_by_path_and_as_hardware_local(measured, proxy_cache, tiny_dir, tmp_path):
    out, table = measured
    base = ["model=tiny", "decode.gen_length=12", "decode.block_length=8", "decode.steps=8", "limit_prompts=2",
            "source=trace", "system=fiddler", "budget=custom", "budget.experts_per_layer=24",
            f"cache_dir={proxy_cache}", "tracking.enabled=false"]
    by_path = run_job(compose_checked([*base, f"hardware.file={out}"]), tmp_path / "file")
    assert by_path.identity.hardware == "box"
    assert "cpu_table_seconds" not in by_path.hardware_estimates  # measured, not estimated
    assert "cpu_tflops" not in by_path.hardware_estimates  # not charged: the table replaces the roofline
    as_local = run_job(compose_checked([*base, "hardware=local", f"hardware.profile_path={table}"]),
                       tmp_path / "local")
    assert as_local.identity.hardware == "local"
    assert as_local.metrics["modeled_time_s"] == by_path.metrics["modeled_time_s"]  # the same measured table
    geometry = nominal_geometry(compose_checked(base).model)
    hw = load_hardware(compose_checked([*base, f"hardware.file={out}"]).hardware, geometry)
    assert CostModel(geometry, hw).cpu_expert_time(1) == min(hw.cpu_table_seconds)  # made non-decreasing


def test_a_missing_or_foreign_profile_file_is_a_one_line_error(tmp_path):
    geometry = nominal_geometry(compose_checked(["model=tiny"]).model)
    with pytest.raises(HarnessError, match="no such file"):
        load_hardware(HardwareConfig(file=str(tmp_path / "none.yaml")), geometry)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncolour: red\n")
    with pytest.raises(HarnessError, match="unknown keys"):
        load_hardware(HardwareConfig(file=str(bad)), geometry)
