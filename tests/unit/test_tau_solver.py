"""TIDE's tau* solver: the drift estimate, f(tau), and the argmin against a brute force."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.accounting.cost import CostModel, HardwareConfig
from harness.common.errors import HarnessError
from harness.model.config import LLaDA2Config
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from systems.registry import make_system
from systems.tide_tau import (
    RefreshReplay,
    denoise_blocks,
    estimate_drift,
    miss_fraction,
    refresh_residency,
    solve_tau,
    top_b_mask,
)

GEO = LLaDA2Config(num_hidden_layers=3, num_experts=64, n_group=1, topk_group=1, num_experts_per_tok=8)
COST = CostModel(GEO, HardwareConfig())


def drifting_trace(
    d: float,
    capacity: int = 16,
    n_layers: int = 2,
    n_experts: int = 64,
    steps: int = 16,
    blocks: int = 40,
    seed: int = 0,
) -> RoutingTrace:
    """Per layer and block a top set of `capacity` experts; every step each member leaves
    it with probability d, replaced by an expert from outside. Members carry 20-29 tokens,
    a few outsiders 1-2, so the top-B set is exactly the member set."""
    gen = torch.Generator().manual_seed(seed)
    trace = RoutingTrace(n_layers, n_experts)
    members = [set(torch.randperm(n_experts, generator=gen)[:capacity].tolist()) for _ in range(n_layers)]
    g = 0
    for block in range(blocks):
        loads = []
        for s in range(steps):
            row = torch.zeros(n_layers, n_experts, dtype=torch.long)
            for layer in range(n_layers):
                if s:  # drift
                    leaving = {e for e in members[layer] if float(torch.rand(1, generator=gen)) < d}
                    outside = [e for e in range(n_experts) if e not in members[layer]]
                    pick = torch.randperm(len(outside), generator=gen)[: len(leaving)].tolist()
                    members[layer] = (members[layer] - leaving) | {outside[i] for i in pick}
                noise = torch.randint(0, 3, (n_experts,), generator=gen) * (
                    torch.rand(n_experts, generator=gen) < 0.3
                )
                row[layer] = noise
                for e in members[layer]:
                    row[layer, e] = 20 + int(torch.randint(0, 10, (1,), generator=gen))
            loads.append(row)
        for s, row in enumerate(loads):
            trace.add_step(StepInfo(prompt=0, block=block, step=s, global_step=g, is_first_block=block == 0))
            for layer in range(n_layers):
                trace.record(layer, row[layer])
            g += 1
        if block % 3 == 0:  # commits between blocks must be ignored
            trace.add_step(StepInfo(0, block, steps, g, block == 0, kind="commit"))
            g += 1
    return trace


@pytest.mark.parametrize("d", [0.05, 0.1, 0.25])
def test_drift_estimate_is_within_ten_percent(d: float) -> None:
    solution = solve_tau(drifting_trace(d), 16, COST)
    assert abs(solution.drift_d - d) <= 0.1 * d


# ---- an independent brute force --------------------------------------------------------
def _top(load: list[int], capacity: int) -> set[int]:
    routed = sorted((e for e in range(len(load)) if load[e] > 0), key=lambda e: (-load[e], e))
    return set(routed[:capacity])


def _refresh(resident: set[int], load: list[int], capacity: int) -> set[int]:
    target = _top(load, capacity)
    promote = target - resident
    n_demote = max(0, len(promote) - (capacity - len(resident)))
    demote = sorted(resident - target, key=lambda e: (load[e], e))[:n_demote]
    return (resident - set(demote)) | target


def _blocks(trace: RoutingTrace) -> list[list[list[list[int]]]]:
    out: dict[tuple[int, int], list] = {}
    loads = trace.loads.tolist()
    for i, info in enumerate(trace.steps):
        if info.kind == "denoise":
            out.setdefault((info.prompt, info.block), []).append((info.step, loads[i]))
    return [[row for _, row in sorted(rows)] for rows in out.values()]


def brute_force_tau(trace: RoutingTrace, capacity: int, cost: CostModel) -> tuple[int, list[float], float]:
    blocks = _blocks(trace)
    n_layers = len(blocks[0][0])
    steps = max(len(b) for b in blocks)
    dropped = kept = 0
    for block in blocks:
        for layer in range(n_layers):
            for a, b in itertools.pairwise(block):
                sa, sb = _top(a[layer], capacity), _top(b[layer], capacity)
                dropped += len(sa - sb)
                kept += len(sa)
    d = dropped / kept
    pairs = [sum(row[layer]) for block in blocks for row in block for layer in range(n_layers)]
    routed_experts = sum(
        1 for block in blocks for row in block for layer_row in row for n in layer_row if n > 0
    )
    mean_tokens = max(1, round(sum(pairs) / routed_experts))
    c_cu = cost.cpu_expert_time(mean_tokens) / mean_tokens
    lat = []
    for tau in range(1, steps + 1):
        resident = [set(range(capacity)) for _ in range(n_layers)]
        missed = routed = 0
        for block in blocks:
            for s, row in enumerate(block):
                for layer in range(n_layers):
                    if s % tau == 0:
                        resident[layer] = _refresh(resident[layer], row[layer], capacity)
                    missed += sum(n for e, n in enumerate(row[layer]) if e not in resident[layer])
                    routed += sum(row[layer])
        f = missed / routed
        io = cost.copy_time(1) * capacity * (steps / tau) * (1 - (1 - d) ** tau)
        lat.append(io + c_cu * steps * (sum(pairs) / len(pairs)) * f)
    return min(range(1, steps + 1), key=lambda t: (lat[t - 1], t)), lat, d


# slow links against fast drift put tau* inside 1..T (10, 9, 11) or at 1
@pytest.mark.parametrize(("d", "pcie_gbps"), [(0.03, 1.0), (0.1, 6.0), (0.3, 8.0), (0.1, 25.0)])
def test_tau_star_is_the_brute_force_argmin(d: float, pcie_gbps: float) -> None:
    cost = CostModel(GEO, HardwareConfig(pcie_gbps=pcie_gbps))
    trace = drifting_trace(d, steps=12, blocks=6, seed=3)
    solution = solve_tau(trace, 16, cost)
    tau, lat, d_hat = brute_force_tau(trace, 16, cost)
    assert solution.tau_star == tau
    assert solution.drift_d == pytest.approx(d_hat)
    assert solution.lat_curve == pytest.approx(lat, rel=1e-9)
    assert solution.steps_per_block == 12 and len(solution.f_curve) == 12


def test_slow_links_refresh_less_often() -> None:
    trace = drifting_trace(0.05, steps=16, blocks=8, seed=5)
    fast = solve_tau(trace, 16, CostModel(GEO, HardwareConfig(pcie_gbps=200.0))).tau_star
    slow = solve_tau(trace, 16, CostModel(GEO, HardwareConfig(pcie_gbps=0.5))).tau_star
    assert fast < slow


def test_f_and_d_on_a_hand_made_block() -> None:
    block = torch.tensor([[[2, 1, 0, 0]], [[0, 3, 0, 0]], [[1, 1, 0, 0]]])  # [steps, L=1, E=4], B=1
    assert miss_fraction([block], 1, 1) == pytest.approx(2 / 8)  # top-1: {0}, {1}, {0} (tie -> lower id)
    assert miss_fraction([block], 1, 2) == pytest.approx(5 / 8)
    assert miss_fraction([block], 1, 3) == pytest.approx(5 / 8)
    assert estimate_drift([block], 1) == pytest.approx(1.0)


def test_steps_per_block_comes_from_the_trace_unless_given() -> None:
    trace = drifting_trace(0.1, steps=6, blocks=3)
    assert solve_tau(trace, 16, COST).steps_per_block == 6
    explicit = solve_tau(trace, 16, COST, steps_per_block=4)
    assert explicit.steps_per_block == 4 and len(explicit.lat_curve) == 4 and 1 <= explicit.tau_star <= 4


def test_auto_tau_needs_denoise_steps() -> None:
    with pytest.raises(HarnessError, match=r"system\.tau"):
        solve_tau(None, 16, COST)
    only_commits = RoutingTrace(2, 64)
    only_commits.add_step(StepInfo(0, 0, 3, 0, True, kind="commit"))
    with pytest.raises(HarnessError, match="calibration"):
        solve_tau(only_commits, 16, COST)


def test_tide_reports_the_solution() -> None:
    from harness.engine.engine import OffloadEngine

    tide = make_system("tide", {"tau": "auto"})
    engine = OffloadEngine(tide, GEO, 16, COST)
    engine.prepare(drifting_trace(0.1, steps=8, blocks=4))
    report = tide.report()
    assert report["tau_star"] == report["tau"] == tide.tau
    assert len(report["lat_curve"]) == len(report["f_curve"]) == 8
    assert report["tau_star"] == 1 + min(range(8), key=lambda i: (report["lat_curve"][i], i))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31), n_experts=st.integers(1, 12), capacity=st.integers(0, 12))
def test_vector_refresh_matches_the_set_rule(seed: int, n_experts: int, capacity: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    capacity = min(capacity, n_experts)
    load = torch.randint(0, 4, (n_experts,), generator=gen)
    start = set(torch.randperm(n_experts, generator=gen)[:capacity].tolist())
    if torch.rand(1, generator=gen) < 0.5 and start:
        start.pop()  # not always full
    mask = torch.zeros(n_experts, dtype=torch.bool)
    mask[list(start)] = True
    after = refresh_residency(mask, load, capacity)
    assert set(torch.nonzero(after).flatten().tolist()) == _refresh(start, load.tolist(), capacity)
    assert set(torch.nonzero(top_b_mask(load, capacity)).flatten().tolist()) == _top(load.tolist(), capacity)


def charged_step_by_step(blocks: list[torch.Tensor], capacity: int, tau: int, overlap: bool) -> float:
    """The charged objective as first written: one step at a time, refreshing in place."""
    n_layers, n_experts = blocks[0].shape[1:]
    resident = torch.zeros(n_layers, n_experts, dtype=torch.bool)
    resident[:, :capacity] = True
    top = max(int(block.max()) for block in blocks)
    gpu_table = torch.from_numpy(COST.time_table("gpu", top))
    cpu_table = torch.from_numpy(COST.time_table("cpu", top))
    total = 0.0
    for block in blocks:
        loads = block.long()
        for s in range(block.shape[0]):
            copies = torch.zeros(n_layers, dtype=torch.float64)
            if s % tau == 0:
                after = refresh_residency(resident, loads[s], capacity)
                copies = (after & ~resident).sum(-1).double()
                resident = after
            routed = loads[s] > 0
            gpu = torch.where(routed & resident, gpu_table[loads[s]], 0.0).sum(-1)
            cpu = torch.where(routed & ~resident, cpu_table[loads[s]], 0.0).sum(-1)
            io = copies * COST.copy_time(1)
            layer = torch.maximum(io + gpu, cpu) if overlap else io + gpu + cpu
            total += float(layer.sum())
    return total / (len(blocks) * n_layers)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_precomputed_replay_charges_exactly_what_a_step_by_step_replay_charges(overlap: bool) -> None:
    blocks = denoise_blocks(drifting_trace(0.2, blocks=6))
    replay = RefreshReplay(blocks, 16, COST)
    for tau in (1, 2, 3, 5, 16):
        assert replay.run(tau, overlap)[2] == charged_step_by_step(blocks, 16, tau, overlap)  # bit for bit


def test_layer_seconds_summed_once_per_distinct_row_equal_the_full_sums_bit_for_bit():
    """`RefreshWindows.layer_seconds` sums each distinct (step, layer, served experts) row once
    for every tau; each tau's [S, L] must be the torch sum of where(served, seconds, 0) over
    the whole [S, L, E] residency (misses: where(served, 0, seconds)), to the bit."""
    from harness.bench import synthetic_trace
    from systems.tide_tau import RefreshWindows, denoise_blocks

    mini = LLaDA2Config.published("llada2_mini")
    blocks = denoise_blocks(synthetic_trace(mini, steps=24, tokens=24, block=8, seed=4))
    windows = RefreshWindows(blocks, 64)
    every = torch.cat(windows.loads)
    table = torch.linspace(1e-5, 9e-4, int(every.max()) + 1, dtype=torch.float64) ** 1.3  # no two loads alike
    per = torch.where(every > 0, table[every], 0.0)
    for tau in range(1, 12):
        serving = windows.at(tau)[0]
        assert torch.equal(windows.layer_seconds(tau, table, True), torch.where(serving, per, 0.0).sum(-1))
        assert torch.equal(windows.layer_seconds(tau, table, False), torch.where(serving, 0.0, per).sum(-1))
    assert windows._rows is not None and len(windows._rows.rows) < windows._rows.taus * per.shape[0] * per.shape[1]
