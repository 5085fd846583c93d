"""DALI's per-layer 0-1 assignment (docs/systems.md, systems/dali.py): every routed expert
goes to the GPU or the CPU so that the layer's finish time

    Phi = max(sum_GPU (gpu(n_e) + copy(e)), sum_CPU cpu(n_e))

is small, under the GPU memory limit: at most `cap` experts on the GPU side (the layer's
budget B: the residents it keeps computing plus the ones it copies in; docs/dali-and-gem.md).
Heaviest expert first, each to the side whose finish time after taking it is smaller (ties:
the side where it costs less), the GPU only while it has a free slot; then the best single
move or GPU/CPU swap, round after round, while one lowers Phi (a move to the GPU only into
a free slot; a swap keeps the count).

It runs for every layer of every forward on the live path, so the loops are compiled
(numba). The side sums are the policy's own estimate, added in ascending expert id order;
the ledger charges the plan with its own (torch-ordered) sums, so this order only decides
ties between assignments equal to the last bit.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from harness.accounting.cost import CostModel
from harness.accounting.counting_sort import heaviest_first

Array = np.ndarray | torch.Tensor


def _np(x: Array) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _tables(loads: np.ndarray, cost: CostModel) -> tuple[np.ndarray, np.ndarray]:
    top = int(loads.max()) if loads.size else 0
    return cost.time_table("gpu", top), cost.time_table("cpu", top)


def side_costs(load: Array, held: Array, cost: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """Per expert: seconds on the GPU side (compute, plus one copy if not resident) and on
    the CPU (float64 [E]; 0 for unrouted experts)."""
    loads, held = _np(load), _np(held)
    gpu, cpu = np.empty(loads.shape[0]), np.empty(loads.shape[0])
    _side_costs(loads, held, *_tables(loads, cost), cost.copy_time(1), gpu, cpu)
    return gpu, cpu


def finish_time(on_gpu: Array, load: Array, held: Array, cost: CostModel) -> float:
    """Phi of an assignment: the later of the GPU side (copies + compute) and the CPU."""
    gpu, cpu = side_costs(load, held, cost)
    return _phi(_np(on_gpu), _np(load), gpu, cpu)


def greedy_pass(load: Array, gpu: np.ndarray, cpu: np.ndarray, cap: int | None = None) -> np.ndarray:
    """bool [E]: the heaviest-first pass alone (no refinement).
    Reference definition: only tests call this (the live path runs `_assign`)."""
    loads = _np(load)
    on_gpu = np.zeros(loads.shape[0], np.bool_)
    _greedy_pass(loads, gpu, cpu, on_gpu, loads.shape[0] if cap is None else cap)
    return on_gpu


def refine(on_gpu: np.ndarray, routed: np.ndarray, gpu: np.ndarray, cpu: np.ndarray,
           cap: int | None = None) -> np.ndarray:
    """`on_gpu` after the moves and swaps (a copy). Token order misjudges experts whose
    copy makes them costly on the GPU; heaviest-first alone can be off by a factor close
    to 2 (tests/unit/test_dali.py).
    Reference definition: only tests call this (the live path runs `_assign`)."""
    refined = on_gpu.copy()
    _refine(refined, routed.astype(np.int64), gpu, cpu, routed.shape[0] if cap is None else cap)
    return refined


def greedy_assignment(load: Array, held: Array, cost: CostModel, cap: int | None = None) -> np.ndarray:
    """bool [E]: routed experts placed on the GPU by the heaviest-first greedy, then
    refined by single moves and pairwise swaps.
    Reference definition: only tests call this (dali calls `assign_layer`)."""
    on_gpu = np.zeros(_np(load).shape[0], np.bool_)
    assign_layer(_np(load), _np(held), cost, on_gpu, cap)
    return on_gpu


def assign_layer(loads: np.ndarray, held: np.ndarray, cost: CostModel, on_gpu: np.ndarray,
                 cap: int | None = None) -> float:
    """Fill `on_gpu` (bool [E], zeroed) with the refined greedy assignment, at most `cap`
    experts on the GPU (None: no limit); return its Phi."""
    limit = loads.shape[0] if cap is None else int(cap)
    return _assign(loads, held, *_tables(loads, cost), cost.copy_time(1), on_gpu, limit)


def scale_to_pairs(hint: np.ndarray, pairs: int) -> np.ndarray:
    """int64 [E] summing to `pairs`: `hint` (>= 0) scaled to it, rounded down, the remainder
    handed out one each by largest fraction (ties to the lower id); zeros for an empty hint."""
    weights = np.maximum(np.asarray(hint, np.float64), 0.0)
    total = float(weights.sum())
    if total <= 0 or pairs <= 0:
        return np.zeros(weights.shape[0], np.int64)
    exact = weights * (pairs / total)
    out = np.floor(exact).astype(np.int64)
    rest = pairs - int(out.sum())
    if rest > 0:
        order = np.argsort(-(exact - out), kind="stable")[:rest]
        out[order] += 1
    return out


# ---- compiled kernels -------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _side_costs(loads: np.ndarray, held: np.ndarray, gpu_table: np.ndarray, cpu_table: np.ndarray,
                copy_one: float, gpu: np.ndarray, cpu: np.ndarray) -> None:
    """`side_costs` into gpu / cpu [E]: the tables at each expert's load, plus one copy on
    the GPU side for a routed expert not held. Twin: tests/kernels/test_dali_assign_kernels.py."""
    for e in range(loads.shape[0]):
        gpu[e] = gpu_table[loads[e]] + (copy_one if loads[e] > 0 and not held[e] else 0.0)
        cpu[e] = cpu_table[loads[e]]


@njit(cache=True, nogil=True)
def _phi(on_gpu: np.ndarray, loads: np.ndarray, gpu: np.ndarray, cpu: np.ndarray) -> float:
    """Phi: the later side over the routed experts, each side added in id order.
    Twin: tests/kernels/test_dali_assign_kernels.py."""
    gpu_side = cpu_side = 0.0
    for e in range(loads.shape[0]):
        if loads[e] > 0:
            if on_gpu[e]:
                gpu_side += gpu[e]
            else:
                cpu_side += cpu[e]
    return max(gpu_side, cpu_side)


@njit(cache=True, nogil=True)
def _greedy_pass(loads: np.ndarray, gpu: np.ndarray, cpu: np.ndarray, on_gpu: np.ndarray, cap: int) -> None:
    """Into `on_gpu` (zeroed): heaviest first, each routed expert to the side whose finish
    time after taking it is smaller (ties: the GPU if it costs no more there); to the CPU
    once `cap` experts are on the GPU. Twin: tests/kernels/test_dali_assign_kernels.py."""
    gpu_side = cpu_side = 0.0
    n_gpu = 0
    for e in heaviest_first(loads):
        g, c = gpu[e], cpu[e]
        if n_gpu >= cap:
            cpu_side += c
            continue
        with_gpu, with_cpu = gpu_side + g, cpu_side + c
        finish_gpu = max(with_gpu, cpu_side)
        finish_cpu = max(gpu_side, with_cpu)
        if finish_gpu < finish_cpu or (finish_gpu == finish_cpu and g <= c):
            on_gpu[e] = True
            gpu_side = with_gpu
            n_gpu += 1
        else:
            cpu_side = with_cpu


@njit(cache=True, nogil=True)
def _refine(on_gpu: np.ndarray, loads: np.ndarray, gpu: np.ndarray, cpu: np.ndarray, cap: int) -> None:
    """The best single move or swap while it lowers Phi: the first best move in id order
    (a CPU expert to the GPU only while fewer than `cap` are there), then a swap [GPU
    expert e -> CPU, CPU expert f -> GPU] only if strictly better (first in (e, f) order).
    Twin: tests/kernels/test_dali_assign_kernels.py (every move and swap evaluated)."""
    n = loads.shape[0]
    g_ids, c_ids = np.empty(n, np.int64), np.empty(n, np.int64)
    while True:
        gpu_side = cpu_side = 0.0
        c_gpu_min, c_cpu_max = np.inf, -np.inf  # over the CPU side's experts
        n_g = n_c = 0
        for e in range(n):
            if on_gpu[e]:
                gpu_side += gpu[e]
                g_ids[n_g] = e
                n_g += 1
            elif loads[e] > 0:
                cpu_side += cpu[e]
                c_ids[n_c] = e
                n_c += 1
                c_gpu_min, c_cpu_max = min(c_gpu_min, gpu[e]), max(c_cpu_max, cpu[e])
        after, first, second = np.inf, -1, -1
        for e in range(n):
            if loads[e] <= 0:
                continue
            if on_gpu[e]:
                moved = max(gpu_side - gpu[e], cpu_side + cpu[e])
            elif n_g < cap:
                moved = max(gpu_side + gpu[e], cpu_side - cpu[e])
            else:
                continue
            if moved < after:
                after, first = moved, e
        for i in range(n_g):
            e = g_ids[i]
            gpu_out, cpu_in = gpu_side - gpu[e], cpu[e]
            # a bound below every swap of e (float rounding is monotone): most rows end here
            if max(gpu_out + c_gpu_min, cpu_side - c_cpu_max + cpu_in) >= after:
                continue
            for j in range(n_c):
                f = c_ids[j]
                swapped = max(gpu_out + gpu[f], cpu_side - cpu[f] + cpu_in)
                if swapped < after:
                    after, first, second = swapped, e, f
        if first < 0 or not after < max(gpu_side, cpu_side) * (1 - 1e-12):
            return
        on_gpu[first] = not on_gpu[first]
        if second >= 0:
            on_gpu[second] = not on_gpu[second]


@njit(cache=True, nogil=True)
def _assign(loads: np.ndarray, held: np.ndarray, gpu_table: np.ndarray, cpu_table: np.ndarray,
            copy_one: float, on_gpu: np.ndarray, cap: int) -> float:
    """`assign_layer`: the side costs, the greedy pass, the refinement; returns Phi.
    Twin: tests/kernels/test_dali_assign_kernels.py."""
    n = loads.shape[0]
    gpu, cpu = np.empty(n), np.empty(n)
    _side_costs(loads, held, gpu_table, cpu_table, copy_one, gpu, cpu)
    _greedy_pass(loads, gpu, cpu, on_gpu, cap)
    _refine(on_gpu, loads, gpu, cpu, cap)
    return _phi(on_gpu, loads, gpu, cpu)
