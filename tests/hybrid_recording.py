"""Recording what the hybrid executor does on the CPU stand-in, for tests/integration/test_hybrid.py:
the plan of every MoE layer call, which weights every expert call read (identified by
content), the pools after the call, and the stand-in's log of copies, waits and compute;
and the checker of that log's order."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import harness.model.experts as experts_module
from harness.accounting.cost import CostModel, HardwareConfig
from harness.decode.decode_batch import decode_with_engine
from harness.decode.decoding import DecodeSettings
from harness.decode.loading import LoadedModel
from harness.engine.engine import OffloadEngine
from harness.hybrid.attach import attach
from harness.hybrid.device import Op, StandInRuntime
from harness.hybrid.executor import HybridExecutor, wrap
from harness.placement.plan import LayerPlan
from harness.placement.trace import RoutingTrace
from harness.zoo.entry import ModelConfig, load_model
from systems.registry import make_system

B = 16  # tiny: 256 experts, top-8; a decode step routes up to 8 x 8 pairs, so misses are common
PROMPTS = ["def add(a, b):", "Write a function that reverses a list."]
CALIBRATION = ["def mul(x, y):", "class Stack:"]
SETTINGS = DecodeSettings(gen_length=12, block_length=8, steps=4)  # prefill, denoise, commit
SLOW_CPU = HardwareConfig(cpu_call_overhead_us=1000.0)  # fiddler then copies every miss to scratch
VARIANTS: dict[str, tuple[str, dict[str, Any], HardwareConfig]] = {
    "gpu_only": ("gpu_only", {}, HardwareConfig()),
    "fiddler": ("fiddler", {}, HardwareConfig()),
    "fiddler+scratch": ("fiddler", {}, SLOW_CPU),
    "mixtral_offload+prefetch": ("mixtral_offload", {"prefetch": True, "prefetch_k": 4}, HardwareConfig()),
    "tide+sync": ("tide", {"tau": 2, "migration": "sync"}, HardwareConfig()),
    "tide+async": ("tide", {"tau": 2, "migration": "async"}, HardwareConfig()),
    "oracle": ("oracle", {}, HardwareConfig()),
}
ASYNC_TAGS = ("async", "prefetch")


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@dataclass
class LayerCall:
    layer: int
    plan: LayerPlan
    computed: list[tuple[str, int]] = field(default_factory=list)  # (side, expert) per expert call
    resident_after: set[int] = field(default_factory=set)
    scratch_bytes_after: int = 0


@dataclass
class Recording:
    tokens: list[list[int]]
    calls: list[LayerCall]
    ops: list[Op]
    executor: HybridExecutor
    runtime: StandInRuntime
    engine: OffloadEngine


class Recorder:
    """Wraps one executor: the plan of every layer call, which weights each expert call
    read (identified by content: every expert of the proxy is distinct), and the pools
    after the call."""

    def __init__(self, executor: HybridExecutor, runtime: StandInRuntime) -> None:
        self.executor, self.runtime = executor, runtime
        self.calls: list[LayerCall] = []
        self.lock = threading.Lock()
        host = executor.placement.host
        self.expert_of = {digest(v.gate): (layer, e) for layer, h in enumerate(host) for e, v in enumerate(h.views)}
        self.host_ptrs = {h.stacks[0].data_ptr(): h.stacks[0] for h in host}

    def side(self, gate: torch.Tensor) -> str:
        for pool in self.executor.pools:
            base, size = pool.stacks[0].data_ptr(), pool.stacks[0].numel() * pool.stacks[0].element_size()
            if base <= gate.data_ptr() < base + size:
                return "gpu"
        for base, stack in self.host_ptrs.items():
            if base <= gate.data_ptr() < base + stack.numel() * stack.element_size():
                return "cpu"
        return "scratch"

    def swiglu(self, real: Callable) -> Callable:
        def recorded(x: torch.Tensor, w: experts_module.ExpertWeights) -> torch.Tensor:
            layer, expert = self.expert_of[digest(w.gate)]
            with self.lock:
                assert self.calls[-1].layer == layer, "an expert of another layer was computed"
                self.calls[-1].computed.append((self.side(w.gate), expert))
            return real(x, w)

        return recorded

    def install(self, engine: OffloadEngine) -> None:
        decide, run_experts = engine.decide, self.executor.run_experts

        def planned(layer: int, load: torch.Tensor, hint: torch.Tensor | None = None) -> tuple[LayerPlan, Any]:
            plan, pending = decide(layer, load, hint)
            self.calls.append(LayerCall(layer, plan))
            return plan, pending

        def ran(layer: int, *args: Any) -> torch.Tensor:
            out = run_experts(layer, *args)
            call = self.calls[-1]
            call.resident_after = self.executor.pools[layer].holds()
            call.scratch_bytes_after = self.runtime.live_bytes["scratch"]
            return out

        engine.decide = planned  # type: ignore[method-assign]
        self.executor.run_experts = ran  # type: ignore[method-assign]


def load_tiny(tiny_dir: Path) -> LoadedModel:
    """The tiny proxy at tiny_dir, loaded by its entry (charged as itself)."""
    return load_model(ModelConfig(name="tiny", nominal="proxy", path=str(tiny_dir)), tiny_dir)


def record_run(tiny_dir: Path, calibration: RoutingTrace, variant: str) -> Recording:
    name, options, hardware = VARIANTS[variant]
    loaded = load_tiny(tiny_dir)
    runtime = StandInRuntime()
    attach(loaded.model, runtime)
    g = loaded.nominal
    system = make_system(name, options)
    engine = OffloadEngine(system, g, B, CostModel(g, hardware))
    engine.prepare(calibration if system.needs_calibration else None, SETTINGS.steps)
    executor = wrap(loaded.model, engine)
    assert isinstance(executor, HybridExecutor)
    recorder = Recorder(executor, runtime)
    recorder.install(engine)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(experts_module, "swiglu", recorder.swiglu(experts_module.swiglu))
        batch = decode_with_engine(loaded, executor, PROMPTS, SETTINGS, desc=variant)
    executor.close()
    return Recording([o.generated for o in batch.outputs], recorder.calls, list(runtime.ops), executor, runtime,
                     engine)


def order_violations(ops: list[Op]) -> list[str]:
    """Every GPU use waits (or a device synchronize ran) after the latest copy of that expert;
    no layer waits on an async copy it issued itself. Copies land in issue order (one stream)."""
    problems: list[str] = []
    latest: dict[tuple[int, int], int] = {}  # (layer, expert) -> event of its latest copy
    covered = -1  # every copy with an event <= covered has been waited on
    issued = -1
    own_async: set[int] = set()
    for op in ops:
        if op.kind == "copy":
            latest[(op.layer, op.experts[0])] = op.event
            issued = max(issued, op.event)
            if op.tag in ASYNC_TAGS:
                own_async.add(op.event)
        elif op.kind == "wait":
            covered = max(covered, op.event)
            if any(e <= op.event for e in own_async):
                problems.append(f"layer {op.layer} waited on an async copy it issued")
        elif op.kind == "sync":
            covered = issued
        elif op.kind == "plan":
            own_async = set()
        elif op.kind == "gpu":
            for e in op.experts:
                if (op.layer, e) not in latest:
                    problems.append(f"layer {op.layer} computed expert {e} on the GPU without any copy")
                elif latest[(op.layer, e)] > covered:
                    problems.append(f"layer {op.layer} computed expert {e} before waiting for its copy")
    return problems


def calls_of(ops: list[Op]) -> list[list[Op]]:
    calls: list[list[Op]] = []
    for op in ops:
        if op.kind == "plan":
            calls.append([])
        if calls and op.kind not in ("copy", "sync"):
            calls[-1].append(op)
    return calls
