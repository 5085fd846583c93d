"""systems/oracle.py: the compiled search for min Phi (`_split_routed`, `_best_split`,
`_min_phi_cells` and its two bisections) against dense evaluation and linear scans, and
the held set (`held_moves`) against its stable-sort definition."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from systems import oracle
from systems.oracle import held_moves
from tests.kernels.support import KERNEL, loads, masks, same_bits, sizes


# ---- the twins ---------------------------------------------------------------------------
def split_routed_reference(loads: np.ndarray, gpu_table: np.ndarray, gpu_one: float) -> tuple[np.ndarray, np.ndarray]:
    """Test-only reference: the flat routed experts (GPU time that of one token), heaviest
    first, ties to the lower id; the heavy routed ones by id."""
    routed = loads > 0
    flat = routed & (gpu_table[loads] == gpu_one)
    by_load = np.argsort(-loads, kind="stable")
    return by_load[flat[by_load]], np.flatnonzero(routed & ~flat)


def phi_cells_reference(flat_gpu: np.ndarray, cpu_rest: np.ndarray, heavy_gpu: np.ndarray, heavy_cpu: np.ndarray
                        ) -> tuple[float, int, int]:
    """Test-only reference: (phi, row, col) of the first minimum in row-major order of
    phi[r, c] = max(flat_gpu[c] + heavy_gpu[r], cpu_rest[c] - heavy_cpu[r]), every cell
    evaluated."""
    phi = np.maximum(flat_gpu[None, :] + heavy_gpu[:, None], cpu_rest[None, :] - heavy_cpu[:, None])
    row, col = divmod(int(phi.argmin()), phi.shape[1])
    return float(phi[row, col]), row, col


def best_split_reference(flat_cpu: np.ndarray, total_cpu: float, gpu_one: float, copy_one: float, capacity: int,
                         option_j: np.ndarray, option_start: np.ndarray, heavy_gpu: np.ndarray,
                         heavy_cpu: np.ndarray) -> tuple[float, int, int, int]:
    """Test-only reference: (Phi, option, row, flat count) of the first minimum, options in
    order, each option's cells row-major. With k flat experts on the GPU (heaviest first)
    and option i's j heavy ones, the GPU side copies the experts beyond the capacity and
    computes the flat ones at one token's time; the CPU keeps the total less the k
    heaviest flat experts' seconds (subtracted as one sum, added heaviest first)."""
    n_cols = flat_cpu.shape[0] + 1
    saved = [0.0]
    for seconds in flat_cpu:
        saved.append(saved[-1] + seconds)
    cpu_rest = np.array([total_cpu - s for s in saved])
    best = (np.inf, -1, 0, 0)
    for i, j in enumerate(option_j):
        lo, hi = option_start[i], option_start[i + 1]
        flat_gpu = np.array([copy_one * max(k + j - capacity, 0.0) + k * gpu_one for k in range(n_cols)])
        value, row, col = phi_cells_reference(flat_gpu, cpu_rest, heavy_gpu[lo:hi], heavy_cpu[lo:hi])
        if value < best[0]:
            best = (value, i, row, col)
    return best


def first_row_reference(rows: int, crossed: object) -> int:
    """Test-only reference: the first row r where crossed(r), else `rows` (a linear scan)."""
    return next((r for r in range(rows) if crossed(r)), rows)


def held_reference(loads: np.ndarray, gpu: np.ndarray, resident: np.ndarray, capacity: int) -> np.ndarray:
    """Test-only reference: stable sorts, heaviest first, then G's residents, G, the rest;
    the first `capacity` are held."""
    by_load = np.flatnonzero(loads)[np.argsort(-loads[loads > 0], kind="stable")]
    rank = np.where(gpu[by_load], np.where(resident[by_load], 0, 1), 2)
    held = np.zeros(loads.shape[0], bool)
    held[by_load[np.argsort(rank, kind="stable")[:capacity]]] = True
    return held


# ---- inputs ------------------------------------------------------------------------------
GRID = st.sampled_from([1.0, 0.5, 0.25])


def rising(data: st.DataObject, n: int, top: int) -> np.ndarray:
    """n non-decreasing float seconds on a coarse grid (many ties)."""
    return np.sort(np.array(data.draw(st.lists(st.integers(0, top), min_size=n, max_size=n)), np.float64)
                   * data.draw(GRID))


def heavy_times(data: st.DataObject, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """A heavy option's GPU and CPU times by its ascending token sums: monotone (affine
    costs) or, now and then, arbitrary (the kernel then evaluates every cell)."""
    if data.draw(st.integers(0, 4)) == 0:
        return tuple(np.array(data.draw(st.lists(st.floats(0, 50), min_size=rows, max_size=rows)))
                     for _ in range(2))
    return rising(data, rows, 20), rising(data, rows, 20)


# ---- the tests ---------------------------------------------------------------------------
def test_the_oracles_searched_minimum_is_the_dense_argmin() -> None:
    """_min_phi_cells searches each column's crossing instead of evaluating every cell; with
    many ties (costs on a coarse grid) it must still pick the dense argmin's (value, row, col)."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        rows, cols, q = int(rng.integers(1, 200)), int(rng.integers(1, 40)), float(rng.choice([1.0, 0.5, 0.25]))
        heavy_gpu, heavy_cpu = np.sort(rng.integers(0, 20, rows) * q), np.sort(rng.integers(0, 20, rows) * q)
        flat_gpu, cpu_rest = np.sort(rng.integers(0, 30, cols) * q), np.sort(rng.integers(0, 60, cols) * q)[::-1].copy()
        # dense_cells=0: always search
        got = oracle._min_phi_cells(flat_gpu, cpu_rest, heavy_gpu, heavy_cpu, 0)
        assert same_bits(got, phi_cells_reference(flat_gpu, cpu_rest, heavy_gpu, heavy_cpu))


@KERNEL
@given(st.data())
def test_min_phi_cells_searched_or_dense_is_the_dense_argmin(data: st.DataObject) -> None:
    rows, cols = data.draw(st.integers(1, 60)), data.draw(st.integers(1, 20))
    heavy_gpu, heavy_cpu = heavy_times(data, rows)
    flat_gpu, cpu_rest = rising(data, cols, 30), rising(data, cols, 60)[::-1].copy()
    dense_cells = data.draw(st.sampled_from([0, 50, oracle.DENSE_CELLS]))
    got = oracle._min_phi_cells(flat_gpu, cpu_rest, heavy_gpu, heavy_cpu, dense_cells)
    assert same_bits(got, phi_cells_reference(flat_gpu, cpu_rest, heavy_gpu, heavy_cpu))


@KERNEL
@given(st.data())
def test_the_bisections_are_linear_scans(data: st.DataObject) -> None:
    rows, cols = data.draw(st.integers(0, 40)), data.draw(st.integers(1, 10))
    heavy_gpu, heavy_cpu = rising(data, rows, 20), rising(data, rows, 20)  # their domain: monotone rows
    flat_gpu, cpu_rest = rising(data, cols, 30), rising(data, cols, 60)[::-1].copy()
    c = data.draw(st.integers(0, cols - 1))
    low = data.draw(st.integers(-10, 70)) * 0.25

    def gpu_dominates(r: int) -> bool:
        return flat_gpu[c] + heavy_gpu[r] >= cpu_rest[c] - heavy_cpu[r]

    assert oracle._first_row_gpu_dominates(c, flat_gpu, cpu_rest, heavy_gpu, heavy_cpu) == \
        first_row_reference(rows, gpu_dominates)
    assert oracle._first_row_cpu_at_most(c, low, cpu_rest, heavy_cpu) == \
        first_row_reference(rows, lambda r: cpu_rest[c] - heavy_cpu[r] <= low)


@KERNEL
@given(st.data())
def test_best_split_is_the_dense_minimum_over_every_option(data: st.DataObject) -> None:
    n_flat = data.draw(st.integers(0, 12))
    flat_cpu = rising(data, n_flat, 20)[::-1].copy()  # heaviest first
    n_options = data.draw(st.integers(1, 4))
    option_j = np.array(sorted(data.draw(st.lists(st.integers(0, 6), min_size=n_options, max_size=n_options))))
    lengths = data.draw(st.lists(st.integers(1, 12), min_size=n_options, max_size=n_options))
    option_start = np.cumsum([0, *lengths])
    times = [heavy_times(data, length) for length in lengths]
    heavy_gpu, heavy_cpu = (np.concatenate([t[side] for t in times]) for side in range(2))
    sums = np.zeros(option_start[-1])  # read by the caller only
    total_cpu = float(flat_cpu.sum()) + data.draw(st.integers(0, 60)) * 0.25
    gpu_one, copy_one = data.draw(GRID), data.draw(st.sampled_from([0.25, 1.0, 3.0]))
    capacity = data.draw(st.integers(0, 8))
    got = oracle._best_split(flat_cpu, total_cpu, gpu_one, copy_one, capacity, option_j, option_start, sums,
                             heavy_gpu, heavy_cpu, data.draw(st.sampled_from([0, oracle.DENSE_CELLS])))
    want = best_split_reference(flat_cpu, total_cpu, gpu_one, copy_one, capacity, option_j, option_start,
                                heavy_gpu, heavy_cpu)
    assert same_bits(got, want)


@KERNEL
@given(st.data())
def test_split_routed_is_flat_heaviest_first_then_heavy_by_id(data: st.DataObject) -> None:
    n = data.draw(sizes(0, 40))
    loads_ = data.draw(loads(n, top=12))
    gpu_one = 1.0
    # a GPU table flat up to a ridge, then rising (and, now and then, flat again further on)
    ridge = data.draw(st.integers(1, 13))
    gpu_table = np.array([gpu_one if k <= ridge or data.draw(st.booleans()) else gpu_one + k for k in range(13)])
    order = np.full(n, -1, np.int64)
    n_flat, n_heavy = oracle._split_routed(loads_, gpu_table, gpu_one, order)
    flat, heavy = split_routed_reference(loads_, gpu_table, gpu_one)
    assert (n_flat, n_heavy) == (len(flat), len(heavy))
    assert same_bits(order[:n_flat], flat) and same_bits(order[n_flat:n_flat + n_heavy], heavy)


def check_held_moves(loads_: np.ndarray, gpu: np.ndarray, resident: np.ndarray, capacity: int) -> None:
    masks_ = np.ones((4, loads_.shape[0]), bool)  # garbage: the kernel writes every entry
    held_moves(loads_, gpu, resident, capacity, masks_)
    held = held_reference(loads_, gpu, resident, capacity)
    assert same_bits(masks_[0], (loads_ > 0) & ~gpu)
    assert same_bits(masks_[2], gpu & ~held)
    assert same_bits(masks_[1], (held & ~resident) | (gpu & ~held))
    assert same_bits(masks_[3], resident & ~held)


def test_the_oracles_held_set_is_g_resident_first_then_g_then_the_rest_heaviest_first() -> None:
    rng = np.random.default_rng(1)
    for _ in range(1000):
        n = int(rng.integers(1, 30))
        loads_ = rng.integers(0, 6, n).astype(np.int64)
        gpu = (loads_ > 0) & (rng.random(n) < 0.5)
        check_held_moves(loads_, gpu, rng.random(n) < 0.4, int(rng.integers(0, n + 1)))


@KERNEL
@given(st.data())
def test_held_moves_on_any_layer(data: st.DataObject) -> None:
    n = data.draw(sizes(0, 30))
    loads_ = data.draw(loads(n, top=6))
    gpu = (loads_ > 0) & data.draw(masks(n))
    check_held_moves(loads_, gpu, data.draw(masks(n)), data.draw(st.integers(0, n + 1)))
