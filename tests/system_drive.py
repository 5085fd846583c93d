"""Driving systems through the engine in tests: small geometries, hand-made and random load
sequences, and `drive`, which runs a system step by step, checks every plan against the
invariants (each routed expert computed exactly once, capacity in every layer) and
recomputes the engine's counters and time split from the plans."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.engine.engine import OffloadEngine
from harness.model.config import LLaDA2Config
from harness.placement.plan import move_count
from harness.placement.steps import StepInfo
from harness.placement.system import System
from harness.placement.trace import RoutingTrace
from systems.registry import make_system


def geometry(n_layers: int = 1, n_experts: int = 8) -> LLaDA2Config:
    # the nominal mini expert shape, so the A100 costs are realistic; few layers and experts
    return LLaDA2Config(
        num_hidden_layers=n_layers + 1, num_experts=n_experts, n_group=1, topk_group=1, num_experts_per_tok=2
    )


def loads(n_experts: int, **tokens: int) -> torch.Tensor:
    out = torch.zeros(n_experts, dtype=torch.long)
    for key, value in tokens.items():
        out[int(key[1:])] = value
    return out


def step(block: int, s: int, g: int, first: bool = False, kind: str = "denoise") -> StepInfo:
    return StepInfo(prompt=0, block=block, step=s, global_step=g, is_first_block=first, kind=kind)


def engine(
    name: str | System, options: dict, geo: LLaDA2Config, capacity: int, calibration: RoutingTrace | None = None
) -> OffloadEngine:
    """An engine over system `name` built from `options` (or over a System given as such)."""
    system = name if isinstance(name, System) else make_system(name, options)
    eng = OffloadEngine(system, geo, capacity, CostModel(geo, HardwareConfig()))
    eng.prepare(calibration)
    return eng


def random_steps(gen: torch.Generator, n_blocks: int) -> list[StepInfo]:
    steps, g = [step(0, 0, 0, kind="prefill")], 1
    for block in range(n_blocks):
        n = int(torch.randint(1, 5, (1,), generator=gen))
        for s in range(n):
            steps.append(step(block, s, g, first=block == 0))
            g += 1
        steps.append(step(block, n, g, first=block == 0, kind="commit"))
        g += 1
    return steps


def random_load(gen: torch.Generator, n_experts: int, heavy: bool) -> torch.Tensor:
    load = torch.randint(0, 4, (n_experts,), generator=gen) * (torch.rand(n_experts, generator=gen) < 0.6)
    if heavy and bool(torch.rand(1, generator=gen) < 0.3):
        load[int(torch.randint(0, n_experts, (1,), generator=gen))] = int(
            torch.randint(100, 600, (1,), generator=gen)
        )
    return load


def random_trace(gen: torch.Generator, n_layers: int, n_experts: int, heavy: bool) -> RoutingTrace:
    trace = RoutingTrace(n_layers, n_experts)
    for info in random_steps(gen, 3):
        trace.add_step(info)
        for layer in range(n_layers):
            load = random_load(gen, n_experts, heavy)
            hint = torch.rand(n_experts, generator=gen) if layer + 1 < n_layers else None
            # both hint channels (the residual one the next_gate one reversed: no extra draws)
            trace.record(layer, load, None if hint is None else {"next_gate": hint, "residual": hint.flip(0)})
    return trace


def drive(
    name: str | System, options: dict, geo: LLaDA2Config, capacity: int, calibration: RoutingTrace,
    work: RoutingTrace,
) -> dict:
    """Run the engine step by step, checking every plan and recomputing the counters."""
    eng = engine(name, options, geo, capacity, calibration)
    cap = eng.capacity
    expect = {
        "copies_sync": 0,
        "copies_async": 0,
        "copies_scratch": 0,
        "cpu_expert_tokens": 0,
        "missed_pairs": 0,
    }
    for s, info in enumerate(work.steps):
        eng.begin_step(info, 4, 8)
        for layer in range(geo.n_moe_layers):
            load = work.loads[s, layer].long()
            before = eng.layer_resident(layer)
            hint = work.hint(s, layer, eng.system.hint_channel) if layer + 1 < geo.n_moe_layers else None
            plan = eng.plan_layer(layer, load, hint)
            after = eng.layer_resident(layer)
            routed = load > 0
            assert not (plan.gpu & plan.cpu).any() and np.array_equal(plan.gpu | plan.cpu, routed.numpy())
            assert all(len(eng.layer_resident(lay)) <= cap for lay in range(geo.n_moe_layers))
            free = plan.free_moves
            cached = move_count(plan.fetch_sync) - move_count(plan.scratch)
            expect["copies_sync"] += 0 if free else cached
            expect["copies_scratch"] += move_count(plan.scratch)
            expect["copies_async"] += move_count(plan.fetch_async) + move_count(plan.prefetch)
            expect["cpu_expert_tokens"] += int(load[torch.from_numpy(plan.cpu)].sum())
            missed_from = after if free else before
            expect["missed_pairs"] += sum(
                int(load[e]) for e in range(len(load)) if load[e] > 0 and e not in missed_from
            )
        eng.end_step()
    summary = eng.summary()
    for key, value in expect.items():
        assert summary[key] == value, key
    copies = expect["copies_sync"] + expect["copies_async"] + expect["copies_scratch"]
    assert summary["io_bytes"] == copies * geo.expert_bytes()
    split = sum(
        summary[k] for k in ("time_gpu_experts_s", "time_cpu_experts_s", "time_copies_s", "time_non_expert_s")
    )
    assert split == pytest.approx(summary["modeled_time_s"])
    return summary
