"""tide_adaptive: tau against the drift of synthetic traces (slow, fast, and a switch
between them), the tau rule itself, property tests through the engine, and a lossless run
on the tiny proxy."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.common.errors import HarnessError
from harness.engine.engine import OffloadEngine
from harness.job.config import register_configs
from harness.model.config import LLaDA2Config
from harness.placement.plan import move_count
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from systems.registry import make_system
from systems.tide_adaptive import forward_regrets, layer_regret
from tests.system_drive import geometry

register_configs()

E, B, T, L = 32, 8, 16, 2
GEO = LLaDA2Config(num_hidden_layers=L + 1, num_experts=E, n_group=1, topk_group=1, num_experts_per_tok=8)
COST = CostModel(GEO, HardwareConfig())
SLOW, FAST = (8, 1), (1, 3)  # (rotate every n steps, how many of the 6 hot experts)


def drifting_trace(drifts: list[tuple[int, int]], seed: int = 0) -> RoutingTrace:
    """Block b (T denoise steps; block 0 is the first generated one) has a hot set of six
    experts with ~100 tokens each, rotated by drifts[b]; four 'edge' experts with 5-15
    tokens compete for the last two of the B = 8 slots every step (top-B churn without
    lasting change)."""
    gen = torch.Generator().manual_seed(seed)
    trace = RoutingTrace(L, E)
    hot, incoming, g = list(range(6)), 6, 0
    for block, (every, count) in enumerate(drifts):
        for s in range(T):
            trace.add_step(StepInfo(0, block, s, g, block == 0), 64, 64)
            if g and g % every == 0:
                for _ in range(count):
                    hot.pop(0)
                    hot.append(incoming % 28)
                    incoming += 1
            g += 1
            for layer in range(L):
                load = torch.zeros(E, dtype=torch.long)
                load[hot] = 100 + torch.randint(0, 10, (6,), generator=gen)
                load[28:] = torch.randint(5, 16, (4,), generator=gen)
                trace.record(layer, load)
    return trace


def replay(system: str, options: dict, trace: RoutingTrace) -> tuple[dict, dict]:
    eng = OffloadEngine(make_system(system, options), GEO, B, COST)
    eng.prepare(None, T)
    summary = eng.replay(trace)
    return summary, eng.system.report()


# ---- tau against drift ----------------------------------------------------------------
def test_fast_drift_refreshes_every_step_and_slow_drift_waits() -> None:
    _, slow = replay("tide_adaptive", {}, drifting_trace([SLOW] * 5))
    _, fast = replay("tide_adaptive", {}, drifting_trace([FAST] * 5))
    assert len(slow["tau_per_block"]) == len(fast["tau_per_block"]) == 4  # every block but the first
    assert max(fast["tau_per_block"]) <= 1.1
    assert min(slow["tau_per_block"]) >= 4


def test_tau_drops_when_the_drift_speeds_up_mid_run() -> None:
    _, report = replay("tide_adaptive", {}, drifting_trace([SLOW] * 4 + [FAST] * 3))
    taus = report["tau_per_block"]  # blocks 1..6
    assert min(taus[:3]) >= 4 and max(taus[3:]) <= 1.1


@pytest.mark.parametrize("drift", [SLOW, FAST])
def test_adaptive_tau_is_close_to_the_best_fixed_tau(drift: tuple[int, int]) -> None:
    trace = drifting_trace([drift] * 5)
    adaptive, _ = replay("tide_adaptive", {}, trace)
    fixed = [replay("tide", {"tau": tau}, trace)[0]["modeled_time_s"] for tau in (1, 2, 4, 8, 16)]
    assert adaptive["modeled_time_s"] <= 1.05 * min(fixed)  # measured: within 1% (fast), 3.5% (slow)


# ---- the rent-or-buy rule on hand-made loads -----------------------------------------
def test_layer_regret_is_the_cost_model_gap_to_a_fresh_top_b() -> None:
    load = np.array([100, 0, 100, 0, 1, 0, 0, 0])
    gpu, cpu = (times(torch.from_numpy(load)).numpy() for times in (COST.gpu_expert_times, COST.cpu_expert_times))
    held = np.array([True, True, False, False, False, False, False, False])
    regret, buy = layer_regret(load, held, 2, gpu, cpu, COST.copy_time(1))
    stale = max(COST.gpu_expert_time(100), COST.cpu_expert_time(100) + COST.cpu_expert_time(1))
    fresh = max(2 * COST.gpu_expert_time(100), COST.cpu_expert_time(1))
    assert regret == pytest.approx(stale - fresh) and buy == pytest.approx(COST.copy_time(1))
    top = np.array([True, False, True, False, False, False, False, False])
    assert layer_regret(load, top, 2, gpu, cpu, COST.copy_time(1)) == (0.0, 0.0)


@pytest.mark.parametrize("tokens", [100, 1])
def test_a_refresh_comes_when_the_accumulated_regret_pays_for_it(tokens: int) -> None:
    """Expert 2 (`tokens` tokens) joins the top-2 after the block's step-0 refresh and
    stays: each step it costs a fixed regret r against a refresh copying it (price c).
    The refresh comes at the first step s with r (s - 1) + r >= c, but not at step 1:
    nothing has been observed since step 0's refresh (and no earlier interval exists)."""
    geo = geometry(1, 8)
    eng = OffloadEngine(make_system("tide_adaptive", {}), geo, 2, CostModel(geo, HardwareConfig()))
    eng.prepare(None, 32)
    load = torch.zeros(8, dtype=torch.long)
    load[[0, 1]] = 100
    eng.begin_step(StepInfo(0, 1, 0, 0, False), 8, 8)
    eng.plan_layer(0, load)  # step 0 refreshes: {0, 1}
    load = torch.zeros(8, dtype=torch.long)
    load[0], load[2] = 100, tokens
    held = torch.tensor([True, True] + [False] * 6)
    regret, price = layer_regret(load.numpy(), held.numpy(), 2, COST.gpu_expert_times(load).numpy(),
                                 COST.cpu_expert_times(load).numpy(), COST.copy_time(1))
    expected = next(s for s in range(2, 100) if regret * s >= price)
    refreshed = []
    for s in range(1, 40):
        eng.begin_step(StepInfo(0, 1, s, s, False), 8, 8)
        plan = eng.plan_layer(0, load)
        if move_count(plan.fetch_sync):
            refreshed.append(s)
    assert refreshed == [expected]
    assert (expected == 2) == (tokens == 100)  # a heavy expert is worth copying almost at once


@pytest.mark.parametrize(("options", "key"), [({"migration": "lazy"}, "system.migration")])
def test_tide_adaptive_rejects_invalid_options(options: dict, key: str) -> None:
    with pytest.raises(HarnessError, match=re.escape(key)):
        make_system("tide_adaptive", options)


# ---- through the engine ---------------------------------------------------------------


def test_a_forwards_regrets_priced_together_are_each_layers_own_to_the_bit() -> None:
    gen = np.random.default_rng(3)
    for capacity in (1, 2, 5):
        loads = gen.integers(0, 40, (6, 8)) * (gen.random((6, 8)) < 0.6)
        held = gen.random((6, 8)) < 0.4
        loads[0] = 3  # equal loads: the constant-time sums
        regrets, buys = forward_regrets(loads, held, capacity, COST)
        for row in range(6):
            n = torch.from_numpy(loads[row])
            one = layer_regret(loads[row], held[row], capacity, COST.gpu_expert_times(n).numpy(),
                               COST.cpu_expert_times(n).numpy(), COST.copy_time(1))
            assert (float(regrets[row]), float(buys[row])) == one
