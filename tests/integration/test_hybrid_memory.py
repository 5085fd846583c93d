"""Sizing the hybrid placement to the machine (harness/hybrid/attach.py, wiring.py):
host experts stay pageable (zero-copy) when pinning them would starve the host, and the
all-GPU decode (reference, recorded routing) streams experts through the slots that fit
when the device cannot hold every expert: both decode the gpu_only tokens bit for bit on
the CPU stand-in, in the model's dtype and in bf16 (the device dtype)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.common.errors import HarnessError
from harness.decode.decode_batch import decode_prompts, decode_with_engine
from harness.engine.engine import OffloadEngine
from harness.hybrid.attach import PIN_FRACTION, attach, experts_nbytes
from harness.hybrid.device import StandInRuntime
from harness.hybrid.executor import HybridExecutor
from harness.job.hybrid_setup import RESERVE_MIN_BYTES, all_gpu_engine, fitting_slots, slot_bytes
from harness.placement.trace import RoutingTrace
from systems.registry import make_system
from tests.hybrid_recording import PROMPTS, SETTINGS, load_tiny

GB = 10**9


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> list[list[int]]:
    return [o.generated for o in decode_prompts(load_tiny(tiny_dir), PROMPTS, SETTINGS).outputs]


# ---- the slot arithmetic, on hand-made machines ------------------------------------------
def test_every_expert_resident_when_they_all_fit_beside_the_reserve() -> None:
    # 10 layers x 4 experts x 1 GB = 40 GB; 80 GB total reserves 8 GB
    assert fitting_slots(free_bytes=48 * GB, total_bytes=80 * GB, slot_bytes=GB, n_layers=10, n_experts=4) == 4
    assert fitting_slots(free_bytes=47 * GB, total_bytes=80 * GB, slot_bytes=GB, n_layers=10, n_experts=4) < 4


def test_streaming_leaves_room_for_one_layers_one_use_copies() -> None:
    # usable 30 GB: slots s with 10*s... pools of 9 other layers plus a full layer: 9*s + 4 <= 30 -> s = 2
    slots = fitting_slots(free_bytes=38 * GB, total_bytes=80 * GB, slot_bytes=GB, n_layers=10, n_experts=4)
    assert slots == 2
    assert 10 * slots + (4 - slots) <= 30  # pools plus one layer's worst-case scratch fit


def test_the_reserve_is_at_least_its_floor() -> None:
    # a small device: 10% of 4 GB is below the 2 GiB floor
    free = RESERVE_MIN_BYTES + 8 * 10**6
    assert fitting_slots(free, 4 * GB, slot_bytes=10**6, n_layers=2, n_experts=4) == 4
    assert fitting_slots(free - 1, 4 * GB, slot_bytes=10**6, n_layers=2, n_experts=4) == 3  # (8e6-1-4e6)//1e6


def test_a_device_that_cannot_stream_is_a_one_line_error(tiny_dir: Path) -> None:
    loaded = load_tiny(tiny_dir)
    attach(loaded.model, StandInRuntime(device_bytes=RESERVE_MIN_BYTES))
    g = loaded.nominal
    with pytest.raises(HarnessError, match="too little for one expert slot"):
        all_gpu_engine(loaded, CostModel(g, HardwareConfig()), SETTINGS.steps)


# ---- the all-GPU decode streams when the device is small --------------------------------------
def test_the_all_gpu_decode_streams_through_the_slots_that_fit_and_keeps_the_tokens(tiny_dir, reference) -> None:
    loaded = load_tiny(tiny_dir)
    g = loaded.nominal
    per_slot = slot_bytes(loaded, None)
    slots = 40
    # exactly what 40 slots per layer plus one layer's one-use copies need, beside the reserve
    device = RESERVE_MIN_BYTES + ((g.n_moe_layers - 1) * slots + g.num_experts) * per_slot
    runtime = StandInRuntime(device_bytes=device)
    attach(loaded.model, runtime)
    trace = RoutingTrace(g.n_moe_layers, g.num_experts, geometry=g.to_dict())
    engine = all_gpu_engine(loaded, CostModel(g, HardwareConfig()), SETTINGS.steps, trace=trace)
    assert engine.system.name == "mixtral_offload" and engine.capacity == slots
    batch = decode_with_engine(loaded, engine, PROMPTS, SETTINGS, desc="reference")
    assert [o.generated for o in batch.outputs] == reference
    summary = engine.summary()
    assert summary["cpu_expert_tokens"] == 0  # every expert computed on the (stand-in) GPU
    assert summary["copies_sync"] + summary["copies_scratch"] > 0  # it did stream
    assert runtime.peak["pool"] <= g.n_moe_layers * slots * per_slot
    assert runtime.peak_bytes() <= device - RESERVE_MIN_BYTES
    assert len(trace) == len(batch.outputs[0].records) + len(batch.outputs[1].records)  # routing recorded


def test_the_all_gpu_decode_is_gpu_only_when_everything_fits(tiny_dir) -> None:
    loaded = load_tiny(tiny_dir)
    attach(loaded.model, StandInRuntime(device_bytes=100 * GB))
    g = loaded.nominal
    engine = all_gpu_engine(loaded, CostModel(g, HardwareConfig()), SETTINGS.steps)
    assert engine.system.name == "gpu_only" and engine.capacity == g.num_experts


# ---- pinned or pageable host experts ----------------------------------------------------------
def test_host_experts_are_pinned_when_the_host_can_spare_the_memory(tiny_dir) -> None:
    loaded = load_tiny(tiny_dir)
    need = sum(experts_nbytes(m.expert_weights, m.expert_weights[0].gate.dtype) for m in loaded.model.moe_layers())
    runtime = StandInRuntime(host_bytes=int(need / PIN_FRACTION))
    placement = attach(loaded.model, runtime)
    assert placement.host_pinned and runtime.pinned_bytes == need == placement.host_expert_bytes


def test_host_experts_stay_pageable_and_zero_copy_when_pinning_would_starve_the_host(
        tiny_dir, reference, capsys) -> None:
    loaded = load_tiny(tiny_dir)
    need = sum(experts_nbytes(m.expert_weights, m.expert_weights[0].gate.dtype) for m in loaded.model.moe_layers())
    checkpoint_ptrs = [w.gate.data_ptr() for w in loaded.model.moe_layers()[0].expert_weights]
    runtime = StandInRuntime(host_bytes=int(need / PIN_FRACTION) - 1)
    placement = attach(loaded.model, runtime)
    assert not placement.host_pinned and runtime.pinned_bytes == 0
    assert [v.gate.data_ptr() for v in placement.host[0].views] == checkpoint_ptrs  # no second host copy
    assert "stay pageable" in capsys.readouterr().err
    g = loaded.nominal
    engine = OffloadEngine(make_system("mixtral_offload", {}), g, 16, CostModel(g, HardwareConfig()))
    engine.prepare(None, SETTINGS.steps)
    batch = decode_with_engine(loaded, engine, PROMPTS, SETTINGS, desc="pageable")
    assert [o.generated for o in batch.outputs] == reference


# ---- bf16, the dtype the device runs in ----------------------------------------------------------
def test_in_the_device_dtype_every_system_decodes_the_all_gpu_tokens(tiny_dir) -> None:
    """The stand-in in bf16, as CUDA runs: dtype mix-ups (fp32 router, host-side rotary
    tables, CPU rows joining device rows) fail here as they would on a GPU."""
    loaded = load_tiny(tiny_dir)
    runtime = StandInRuntime(dtype=torch.bfloat16)
    placement = attach(loaded.model, runtime)
    assert placement.host[0].views[0].gate.dtype == torch.bfloat16
    assert loaded.model.moe_layers()[0].gate.weight.dtype == torch.float32
    g = loaded.nominal
    cost = CostModel(g, HardwareConfig())
    calibration = RoutingTrace(g.n_moe_layers, g.num_experts, geometry=g.to_dict())
    reference = decode_with_engine(loaded, all_gpu_engine(loaded, cost, SETTINGS.steps, trace=calibration),
                                   PROMPTS, SETTINGS, desc="reference")
    tokens = [o.generated for o in reference.outputs]
    for name, options in [("fiddler", {}), ("tide", {"tau": 2, "migration": "async"}),
                          ("mixtral_offload", {"prefetch": True})]:
        system = make_system(name, options)
        engine = OffloadEngine(system, g, 16, cost)
        engine.prepare(calibration if system.needs_calibration else None, SETTINGS.steps)
        batch = decode_with_engine(loaded, engine, PROMPTS, SETTINGS, desc=name)
        assert [o.generated for o in batch.outputs] == tokens, name
        assert engine.summary()["missed_pairs"] > 0, name


def test_a_budget_the_device_cannot_hold_is_a_one_line_error(tiny_dir) -> None:
    loaded = load_tiny(tiny_dir)
    g = loaded.nominal
    per_slot = slot_bytes(loaded, None)
    attach(loaded.model, StandInRuntime(device_bytes=16 * g.n_moe_layers * per_slot - 1))
    engine = OffloadEngine(make_system("mixtral_offload", {}), g, 16, CostModel(g, HardwareConfig()))
    engine.prepare(None, SETTINGS.steps)
    with pytest.raises(HarnessError, match=rf"16 experts per layer x {g.n_moe_layers} layers need .* smaller budget"):
        HybridExecutor(engine, loaded.model.placement)
    attach_ok = load_tiny(tiny_dir)
    attach(attach_ok.model, StandInRuntime(device_bytes=16 * g.n_moe_layers * per_slot))
    HybridExecutor(engine, attach_ok.model.placement).close()  # exactly enough
