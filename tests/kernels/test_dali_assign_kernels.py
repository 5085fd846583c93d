"""systems/dali_assign.py: DALI's compiled 0-1 assignment (`_side_costs`, `_phi`,
`_greedy_pass`, `_refine`, `_assign`) against the rules written in numpy and plain Python,
every move and swap evaluated."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from systems.dali_assign import _assign, _greedy_pass, _phi, _refine, _side_costs, refine
from tests.kernels.support import KERNEL, in_order_sum, loads, masks, same_bits, seconds, sizes


# ---- the twins ---------------------------------------------------------------------------
def side_costs_reference(loads: np.ndarray, held: np.ndarray, gpu_table: np.ndarray, cpu_table: np.ndarray,
                         copy_one: float) -> tuple[np.ndarray, np.ndarray]:
    """Test-only reference: per expert, its GPU seconds at its load plus one copy if it is
    routed and not held; its CPU seconds at its load."""
    copies = np.where((loads > 0) & ~held, copy_one, 0.0)
    return gpu_table[loads] + copies, cpu_table[loads]


def phi_reference(on_gpu: np.ndarray, loads: np.ndarray, gpu: np.ndarray, cpu: np.ndarray) -> float:
    """Test-only reference: the later side of the routed experts, each side summed in id order."""
    routed = loads > 0
    return max(in_order_sum(gpu[routed & on_gpu].tolist()), in_order_sum(cpu[routed & ~on_gpu].tolist()))


def greedy_pass_reference(loads: np.ndarray, gpu: np.ndarray, cpu: np.ndarray, cap: int) -> np.ndarray:
    """Test-only reference: heaviest first (ties to the lower id), each routed expert to the
    side whose finish time after taking it is smaller; ties to the GPU if it costs no more
    there; the CPU once `cap` are on the GPU."""
    on_gpu = np.zeros(loads.shape[0], bool)
    sides = {"gpu": 0.0, "cpu": 0.0}
    for e in sorted(np.flatnonzero(loads > 0).tolist(), key=lambda e: -loads[e]):
        if on_gpu.sum() >= cap:
            sides["cpu"] += cpu[e]
            continue
        finish_gpu = max(sides["gpu"] + gpu[e], sides["cpu"])
        finish_cpu = max(sides["gpu"], sides["cpu"] + cpu[e])
        if finish_gpu < finish_cpu or (finish_gpu == finish_cpu and gpu[e] <= cpu[e]):
            on_gpu[e] = True
            sides["gpu"] += gpu[e]
        else:
            sides["cpu"] += cpu[e]
    return on_gpu


def refine_reference(on_gpu: np.ndarray, routed: np.ndarray, gpu: np.ndarray, cpu: np.ndarray,
                     cap: int) -> np.ndarray:
    """Test-only reference: the refinement evaluated everywhere, each round: every single
    move, then every swap [GPU e, CPU f]; the first best move in id order, a swap only if
    strictly lower (the first in (e, f) order); side sums added in id order; no move to the
    GPU when `cap` are there. Stops when the best change does not lower Phi by a relative 1e-12."""
    on_gpu = on_gpu.copy()
    while True:
        gpu_side = cpu_side = 0.0
        for e in range(len(on_gpu)):
            if on_gpu[e]:
                gpu_side += gpu[e]
            elif routed[e]:
                cpu_side += cpu[e]
        moved = np.where(on_gpu, np.maximum(gpu_side - gpu, cpu_side + cpu), np.maximum(gpu_side + gpu, cpu_side - cpu))
        moved[~routed] = np.inf
        if on_gpu.sum() >= cap:
            moved[~on_gpu] = np.inf
        g_ids, c_ids = np.flatnonzero(on_gpu), np.flatnonzero(routed & ~on_gpu)
        swapped = np.maximum(gpu_side - gpu[g_ids, None] + gpu[None, c_ids],
                             cpu_side - cpu[None, c_ids] + cpu[g_ids, None])
        after, change = (float(moved.min()), [int(moved.argmin())]) if moved.size else (np.inf, [])
        if swapped.size and float(swapped.min()) < after:
            i, j = divmod(int(swapped.argmin()), swapped.shape[1])
            after, change = float(swapped[i, j]), [int(g_ids[i]), int(c_ids[j])]
        if not after < max(gpu_side, cpu_side) * (1 - 1e-12):
            return on_gpu
        on_gpu[change] = ~on_gpu[change]


def assign_reference(loads: np.ndarray, held: np.ndarray, gpu_table: np.ndarray, cpu_table: np.ndarray,
                     copy_one: float, cap: int) -> tuple[np.ndarray, float]:
    """Test-only reference: the side costs, the heaviest-first pass, the refinement; and Phi."""
    gpu, cpu = side_costs_reference(loads, held, gpu_table, cpu_table, copy_one)
    on_gpu = refine_reference(greedy_pass_reference(loads, gpu, cpu, cap), loads > 0, gpu, cpu, cap)
    return on_gpu, phi_reference(on_gpu, loads, gpu, cpu)


# ---- inputs ------------------------------------------------------------------------------
def layer(data: st.DataObject) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """(loads, held, GPU table, CPU table, one copy): tables by load, on a coarse grid or not."""
    n = data.draw(sizes(0, 24))
    loads_ = data.draw(loads(n, top=10))
    coarse = data.draw(st.booleans())
    gpu_table, cpu_table = data.draw(seconds(11, coarse)), data.draw(seconds(11, coarse))
    gpu_table[0] = cpu_table[0] = 0.0  # an unrouted expert takes no time
    return loads_, data.draw(masks(n)), gpu_table, cpu_table, data.draw(seconds(1, coarse))[0]


def costs(data: st.DataObject, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(routed, GPU seconds, CPU seconds) per expert, 0 for the unrouted ones."""
    routed = data.draw(masks(n))
    coarse = data.draw(st.booleans())
    gpu, cpu = data.draw(seconds(n, coarse)), data.draw(seconds(n, coarse))
    return routed, np.where(routed, gpu, 0.0), np.where(routed, cpu, 0.0)


# ---- the tests ---------------------------------------------------------------------------
@KERNEL
@given(st.data())
def test_side_costs_and_phi(data: st.DataObject) -> None:
    loads_, held, gpu_table, cpu_table, copy_one = layer(data)
    n = loads_.shape[0]
    gpu, cpu = np.full(n, np.nan), np.full(n, np.nan)
    _side_costs(loads_, held, gpu_table, cpu_table, copy_one, gpu, cpu)
    want_gpu, want_cpu = side_costs_reference(loads_, held, gpu_table, cpu_table, copy_one)
    assert same_bits(gpu, want_gpu) and same_bits(cpu, want_cpu)
    on_gpu = data.draw(masks(n))
    assert same_bits(_phi(on_gpu, loads_, gpu, cpu), phi_reference(on_gpu, loads_, gpu, cpu))


@KERNEL
@given(st.data())
def test_greedy_pass_is_heaviest_first_to_the_earlier_side(data: st.DataObject) -> None:
    n = data.draw(sizes(0, 24))
    loads_ = data.draw(loads(n, top=10))
    _, gpu, cpu = costs(data, n)
    cap = data.draw(st.integers(0, n + 1))
    on_gpu = np.zeros(n, bool)
    _greedy_pass(loads_, gpu, cpu, on_gpu, cap)
    assert same_bits(on_gpu, greedy_pass_reference(loads_, gpu, cpu, cap))
    assert on_gpu.sum() <= cap


def test_the_compiled_refinement_skips_only_swaps_that_cannot_win() -> None:
    """The kernel bounds each GPU expert's swaps and skips rows that cannot beat the best
    change so far; on costs with many ties (a coarse grid) it must pick what evaluating
    every move and swap picks."""
    rng = np.random.default_rng(3)
    for _ in range(3000):
        n = int(rng.integers(1, 40))
        routed = rng.random(n) < 0.8
        q = float(rng.choice([1.0, 0.5, 0.25]))
        gpu = np.where(routed, rng.integers(1, 12, n) * q, 0.0)
        cpu = np.where(routed, rng.integers(1, 30, n) * q, 0.0)
        if rng.random() < 0.5:  # and without ties
            gpu, cpu = gpu * rng.uniform(0.9, 1.1, n), cpu * rng.uniform(0.9, 1.1, n)
        start = routed & (rng.random(n) < 0.5)
        cap = int(start.sum() + rng.integers(0, 3)) if rng.random() < 0.5 else n
        assert same_bits(refine(start, routed, gpu, cpu, cap), refine_reference(start, routed, gpu, cpu, cap))


@KERNEL
@given(st.data())
def test_refine_on_any_start(data: st.DataObject) -> None:
    n = data.draw(sizes(0, 24))
    routed, gpu, cpu = costs(data, n)
    start = routed & data.draw(masks(n))
    cap = int(start.sum()) + data.draw(st.integers(0, 3))
    on_gpu = start.copy()
    _refine(on_gpu, routed.astype(np.int64), gpu, cpu, cap)
    assert same_bits(on_gpu, refine_reference(start, routed, gpu, cpu, cap))
    assert on_gpu.sum() <= cap


@KERNEL
@given(st.data())
def test_assign_is_greedy_then_refined(data: st.DataObject) -> None:
    loads_, held, gpu_table, cpu_table, copy_one = layer(data)
    cap = data.draw(st.integers(0, loads_.shape[0] + 1))
    on_gpu = np.zeros(loads_.shape[0], bool)
    phi = _assign(loads_, held, gpu_table, cpu_table, copy_one, on_gpu, cap)
    want_on_gpu, want_phi = assign_reference(loads_, held, gpu_table, cpu_table, copy_one, cap)
    assert same_bits(on_gpu, want_on_gpu) and same_bits(phi, want_phi) and on_gpu.sum() <= cap
