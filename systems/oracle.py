"""Oracle: a hindsight lower bound on the modeled time of every budget-B system here.

Per layer and step it may hold *any* B experts, moved for free (the engine does not
charge its residency moves: `LayerPlan.free_moves`), and it picks the GPU set G that minimises
the layer's modeled time under the cost model, with the CPU running concurrently:

    Phi(G) = max(copy(max(0, |G| - B)) + sum_G gpu(n_e),  sum_{routed - G} cpu(n_e))

(the experts of G beyond the B resident ones are copied to scratch buffers). It holds the
B experts of G (for a heaviest-first G: the top-B of this step's load).

Why this is a bound. In any other system's plan for a layer, its GPU set G' is covered
by at most B resident experts plus k sync copies, so k >= |G'| - B; the engine charges the
layer at least combine(copy(k) + gpu(G'), cpu(rest)) (async copies and link backlog only
add), and combine >= max. So every layer costs it >= Phi(G') >= min_G Phi(G), the
oracle's charge; non-expert time is the same for all, and forwards are sums of layers.
(gpu_only is outside: it holds all E experts, not B.) A system whose misses' copies
overlap its own GPU experts (Mixtral-Offload's pipeline, harness/accounting/pipeline.py) is outside
the argument when a layer routes more than B experts: the oracle still charges its
scratch copies before the GPU experts, so such a layer may cost the pipeline less.

min Phi is found exactly, not greedily. Routed experts split into *flat* ones, whose GPU
time equals gpu(1) (memory-bound on the GPU), and *heavy* ones. Among flat ones the GPU
cost depends only on how many are chosen, so the heaviest (largest cpu(n)) are best; for
heavy ones gpu(n) and cpu(n) are affine in n (GPU compute-bound, CPU past its ridge or its
table's last segment), so a subset of j heavy experts matters only through its token sum
s: we enumerate the reachable (j, s) with a subset-sum bitset and take, for every number
of flat experts, the reachable s next to where the two sides of Phi cross (Phi is the max
of an increasing and a decreasing function of s). If the heavy costs are not affine (a
measured CPU table extending past the GPU ridge) the heavy experts all go to the GPU and
the layer is counted in report()['inexact_layers'].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import njit

from harness.accounting.cost import CostModel
from harness.accounting.counting_sort import heaviest_first
from harness.accounting.ordered_sums import torch_sum
from harness.placement.plan import LayerPlan
from harness.placement.system import PrepareContext, System
from systems.entry import SystemEntry


@dataclass
class OracleConfig:
    name: str = "oracle"


def _bits(x: int) -> np.ndarray:
    """Positions of the set bits of a non-negative int, ascending."""
    raw = np.frombuffer(x.to_bytes(max(1, (x.bit_length() + 7) // 8), "little"), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(raw, bitorder="little"))


def _affine(n: np.ndarray, t: np.ndarray) -> tuple[float, float] | None:
    """(alpha, beta) with t = alpha + beta n on every point, or None."""
    lo, hi = int(n.argmin()), int(n.argmax())
    if n[hi] == n[lo]:
        return float(torch.from_numpy(t).mean()), 0.0
    beta = float((t[hi] - t[lo]) / (n[hi] - n[lo]))
    alpha = float(t[lo]) - beta * float(n[lo])
    if np.allclose(alpha + beta * n.astype(np.float64), t, rtol=1e-9, atol=1e-15):
        return alpha, beta
    return None


class _SubsetSums:
    """Reachable (count, token sum) of subsets of the heavy experts, reconstructable."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        reach = [1] + [0] * len(sizes)
        self.history = []
        for i, n in enumerate(sizes):
            self.history.append(list(reach))
            for j in range(i + 1, 0, -1):
                reach[j] |= reach[j - 1] << n
        self.reach = reach

    def subset(self, j: int, s: int) -> list[int]:
        chosen = []
        for i in range(len(self.sizes) - 1, -1, -1):
            if (self.history[i][j] >> s) & 1:
                continue  # reachable without item i
            chosen.append(i)
            s -= self.sizes[i]
            j -= 1
        assert j == 0 and s == 0
        return chosen


Options = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _heavy_options(h_n: np.ndarray, g: np.ndarray, h: np.ndarray
                   ) -> tuple[Options, Callable[[int, int], list[int]], bool]:
    """Per reachable count j of heavy experts on the GPU, its token sums s (ascending),
    their GPU time and the CPU time they take off the CPU, packed for `_best_split`:
    (j per option, where each option's rows start (and the end), s, GPU times, CPU
    times); plus a way back from (j, s) to the subset and whether the search is exact."""
    fit_g, fit_h = _affine(h_n, g), _affine(h_n, h)
    if fit_g is None or fit_h is None:  # not affine: all heavy experts on the GPU
        options = (np.array([len(h_n)]), np.array([0, 1]), np.zeros(1), np.array([torch_sum(g)]),
                   np.array([torch_sum(h)]))
        return options, (lambda j, s: list(range(len(h_n)))), False
    sums = _SubsetSums(h_n.tolist())
    counts, rows = [], []
    for j, reach in enumerate(sums.reach):
        if reach:
            s = _bits(reach).astype(np.float64)
            counts.append(j)
            rows.append((s, j * fit_g[0] + fit_g[1] * s, j * fit_h[0] + fit_h[1] * s))
    starts = np.cumsum([0] + [len(s) for s, _, _ in rows])
    options = (np.array(counts), starts, *(np.concatenate([row[i] for row in rows]) for i in range(3)))
    return options, sums.subset, True


DENSE_CELLS = 4096  # up to this many (s, flat count) pairs, phi is evaluated everywhere


def best_gpu_set(load: np.ndarray, capacity: int, cost: CostModel) -> tuple[list[int], float, bool]:
    """(G, Phi(G), exact) minimising Phi over subsets of the routed experts.
    Reference definition: only tests call this (the policy calls `choose_gpu_set`)."""
    gpu = np.zeros(load.shape[0], bool)
    value, exact = choose_gpu_set(load, capacity, cost, gpu)
    return np.flatnonzero(gpu).tolist(), value, exact


# no heavy experts: one option, j = 0 with the token sum 0 (as _heavy_options packs them)
_NO_HEAVY = (np.zeros(1, np.int64), np.array([0, 1]), np.zeros(1), np.zeros(1), np.zeros(1))


def choose_gpu_set(loads: np.ndarray, capacity: int, cost: CostModel, gpu: np.ndarray) -> tuple[float, bool]:
    """Set G in `gpu` (bool [E], all False) minimising Phi; return (Phi(G), exact)."""
    top = int(loads.max()) if loads.size else 0
    gpu_table, cpu_table = cost.time_table("gpu", top), cost.time_table("cpu", top)
    gpu_one, order = cost.gpu_expert_time(1), np.empty(loads.shape[0], np.int64)
    n_flat, n_heavy = _split_routed(loads, gpu_table, gpu_one, order)
    flat_ids, heavy_ids = order[:n_flat], order[n_flat : n_flat + n_heavy]
    total_cpu = torch_sum(cpu_table[loads[loads > 0]])  # in id order
    exact, subset_of, options = True, None, _NO_HEAVY
    if n_heavy:
        h_n = loads[heavy_ids]
        options, subset_of, exact = _heavy_options(h_n, gpu_table[h_n], cpu_table[h_n])
    value, option, row, n_on = _best_split(cpu_table[loads[flat_ids]], total_cpu, gpu_one, cost.copy_time(1),
                                           capacity, *options, DENSE_CELLS)
    gpu[flat_ids[:n_on]] = True
    if subset_of is not None:
        j, starts, sums = options[0], options[1], options[2]
        gpu[heavy_ids[subset_of(int(j[option]), int(sums[starts[option] + row]))]] = True
    return value, exact


# ---- compiled search ----------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _split_routed(loads: np.ndarray, gpu_table: np.ndarray, gpu_one: float, order: np.ndarray) -> tuple[int, int]:
    """Into `order`: the flat routed experts (GPU time that of one token) heaviest first
    (ties to the lower id), then the heavy ones by id; returns their counts.
    Twin: tests/kernels/test_oracle_kernels.py."""
    n_flat = 0
    for e in heaviest_first(loads):
        if gpu_table[loads[e]] == gpu_one:
            order[n_flat] = e
            n_flat += 1
    n_heavy = 0
    for e in range(loads.shape[0]):
        if loads[e] > 0 and gpu_table[loads[e]] != gpu_one:
            order[n_flat + n_heavy] = e
            n_heavy += 1
    return n_flat, n_heavy


@njit(cache=True, nogil=True)
def _best_split(flat_cpu: np.ndarray, total_cpu: float, gpu_one: float, copy_one: float, capacity: int,
                option_j: np.ndarray, option_start: np.ndarray, sums: np.ndarray, heavy_gpu: np.ndarray,
                heavy_cpu: np.ndarray, dense_cells: int) -> tuple[float, int, int, int]:
    """min Phi over the heavy options (option i: j = option_j[i] heavy experts on the GPU,
    their reachable token sums and two times in [option_start[i], option_start[i + 1])) and
    the number of flat experts on the GPU, heaviest first; (Phi, option, row, flat count):
    the first minimum, options in order, each option's cells in row-major order.
    Twin: tests/kernels/test_oracle_kernels.py (every cell evaluated)."""
    n_cols = flat_cpu.shape[0] + 1
    cpu_rest, flat_gpu = np.empty(n_cols), np.empty(n_cols)
    saved = 0.0  # the CPU seconds of the k heaviest flat experts, added in that order
    cpu_rest[0] = total_cpu - saved
    for k in range(1, n_cols):
        saved += flat_cpu[k - 1]
        cpu_rest[k] = total_cpu - saved
    rest_min = cpu_rest.min()
    best, best_option, best_row, best_col = np.inf, -1, 0, 0
    for i in range(option_j.shape[0]):
        lo, hi = option_start[i], option_start[i + 1]
        for k in range(n_cols):
            flat_gpu[k] = copy_one * max(k + option_j[i] - capacity, 0.0) + k * gpu_one
        # a bound below every cell of this option (rounding is monotone): skip it when it
        # cannot beat the best so far, which only a strictly lower phi replaces
        if max(flat_gpu.min() + heavy_gpu[lo:hi].min(), rest_min - heavy_cpu[lo:hi].max()) >= best:
            continue
        value, row, col = _min_phi_cells(flat_gpu, cpu_rest, heavy_gpu[lo:hi], heavy_cpu[lo:hi], dense_cells)
        if value < best:
            best, best_option, best_row, best_col = value, i, row, col
    return best, best_option, best_row, best_col


@njit(cache=True, nogil=True)
def _first_row_gpu_dominates(c: int, flat_gpu: np.ndarray, cpu_rest: np.ndarray, heavy_gpu: np.ndarray,
                             heavy_cpu: np.ndarray) -> int:
    """The first row r of column c where the GPU side reaches the CPU side,
    flat_gpu[c] + heavy_gpu[r] >= cpu_rest[c] - heavy_cpu[r] (n_rows if none), by bisection:
    the heavy times rise with r. Twin: tests/kernels/test_oracle_kernels.py (a linear scan)."""
    lo, hi = 0, heavy_gpu.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if flat_gpu[c] + heavy_gpu[mid] >= cpu_rest[c] - heavy_cpu[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True, nogil=True)
def _first_row_cpu_at_most(c: int, low: float, cpu_rest: np.ndarray, heavy_cpu: np.ndarray) -> int:
    """The first row r of column c whose CPU side is at most `low`,
    cpu_rest[c] - heavy_cpu[r] <= low (n_rows if none), by bisection: heavy_cpu rises with r.
    Twin: tests/kernels/test_oracle_kernels.py (a linear scan)."""
    lo, hi = 0, heavy_cpu.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if cpu_rest[c] - heavy_cpu[mid] <= low:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True, nogil=True)
def _min_phi_cells(flat_gpu: np.ndarray, cpu_rest: np.ndarray, heavy_gpu: np.ndarray, heavy_cpu: np.ndarray,
                   dense_cells: int) -> tuple[float, int, int]:
    """(phi, row, col): the first minimum in row-major order of
    phi[r, c] = max(flat_gpu[c] + heavy_gpu[r], cpu_rest[c] - heavy_cpu[r]), the rows being
    the reachable heavy token sums s (ascending), the columns the flat experts on the GPU.

    Both heavy times grow with s, so in every column the GPU side rises and the CPU side
    falls with the row: the column's minimum sits at the last row before the sides cross
    or the first after, and the first row holding that minimum is where the CPU side
    first drops to it. Both rows are found by bisection on those monotone comparisons,
    made with the float operations of the dense phi, so the choice is the dense argmin's.
    Up to `dense_cells` cells, or if the times are not monotone, every cell is evaluated.
    Twin: tests/kernels/test_oracle_kernels.py (the dense argmin)."""
    n_rows, n_cols = heavy_gpu.shape[0], flat_gpu.shape[0]
    monotone = True
    for r in range(1, n_rows):
        if heavy_gpu[r] < heavy_gpu[r - 1] or heavy_cpu[r] < heavy_cpu[r - 1]:
            monotone = False
    best, best_row, best_col = np.inf, 0, 0
    if n_rows * n_cols <= dense_cells or not monotone:
        for r in range(n_rows):
            for c in range(n_cols):
                value = max(flat_gpu[c] + heavy_gpu[r], cpu_rest[c] - heavy_cpu[r])
                if value < best:
                    best, best_row, best_col = value, r, c
        return best, best_row, best_col
    for c in range(n_cols):
        cross = _first_row_gpu_dominates(c, flat_gpu, cpu_rest, heavy_gpu, heavy_cpu)
        before = after = np.inf
        if cross > 0:
            before = max(flat_gpu[c] + heavy_gpu[cross - 1], cpu_rest[c] - heavy_cpu[cross - 1])
        if cross < n_rows:
            after = max(flat_gpu[c] + heavy_gpu[cross], cpu_rest[c] - heavy_cpu[cross])
        low, first = min(before, after), cross
        if before <= after:  # before the crossing phi is the falling CPU side: its first row at low
            first = _first_row_cpu_at_most(c, low, cpu_rest, heavy_cpu)
        if low < best or (low == best and first < best_row):
            best, best_row, best_col = low, first, c
    return best, best_row, best_col


class Oracle(System):
    name = "oracle"
    config_class = OracleConfig
    overlap = True

    def __init__(self, config: OracleConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self.inexact_layers = 0
        self.planned_layers = 0

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.capacity = ctx.experts_per_layer

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        gpu = np.zeros(load.shape[0], bool)
        _, exact = choose_gpu_set(load, self.capacity, self.ctx.cost, gpu)
        self.planned_layers += 1
        self.inexact_layers += not exact
        masks = np.empty((4, load.shape[0]), bool)  # filled by the kernel: returning arrays from numba costs more
        held_moves(load, gpu, resident, self.capacity, masks)
        cpu, fetch_sync, scratch, evict = masks[0], masks[1], masks[2], masks[3]
        return LayerPlan(
            gpu=gpu, cpu=cpu, fetch_sync=fetch_sync, scratch=scratch, evict=evict,
            free_moves=True,  # hindsight: the engine charges no residency move
        )

    def report(self) -> dict[str, object]:
        return {"planned_layers": self.planned_layers, "inexact_layers": self.inexact_layers}


@njit(cache=True, nogil=True)
def held_moves(loads: np.ndarray, gpu: np.ndarray, resident: np.ndarray, capacity: int, masks: np.ndarray) -> None:
    """The B experts to hold and the moves to them, into masks [4, E]: cpu (routed, not on
    the GPU), fetch_sync (held and not resident, plus the scratch copies), scratch (G's
    experts not held) and evict (resident, not held). Moves are free, so which experts
    are held is immaterial to the charge: G's experts already resident (a resident expert
    cannot be a scratch copy), then G's heaviest, then, when G is smaller than B, the
    heaviest other routed ones, so the GPU holds this step's top-B when G is
    heaviest-first (ties to the lower id: both sorts are stable).
    Twin: tests/kernels/test_oracle_kernels.py."""
    held = np.zeros(loads.shape[0], np.bool_)
    by_load, n_held = heaviest_first(loads), 0
    for rank in range(3):  # a stable sort of by_load on the rank, cut at B
        for e in by_load:
            if n_held < capacity and rank == (0 if gpu[e] and resident[e] else 1 if gpu[e] else 2):
                held[e] = True
                n_held += 1
    cpu, fetch_sync, scratch, evict = masks[0], masks[1], masks[2], masks[3]
    for e in range(loads.shape[0]):
        cpu[e] = loads[e] > 0 and not gpu[e]
        scratch[e] = gpu[e] and not held[e]
        fetch_sync[e] = (held[e] and not resident[e]) or scratch[e]
        evict[e] = resident[e] and not held[e]


# a lower bound, not a contender; each replay re-solves its placement (seconds)
ENTRY = SystemEntry(Oracle, OracleConfig, role="reference", replay_cost="costly",
                    about="Hindsight lower bound: free moves of the top-B, the cheapest CPU/GPU split of the rest.")
