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
overlap its own GPU experts (Mixtral-Offload's pipeline, harness/core/pipeline.py) is outside
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

import numpy as np
import torch
from numba import njit

from harness.core.cost import CostModel
from harness.core.ordered_sums import torch_sum
from systems.base import LayerPlan, PrepareContext, System


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


def _heavy_options(h_n: np.ndarray, g: np.ndarray, h: np.ndarray):
    """Per reachable count j of heavy experts on the GPU: (j, token sums s, their GPU time,
    the CPU time they take off the CPU), plus a way back from (j, s) to the subset."""
    fit_g, fit_h = (_affine(h_n, g), _affine(h_n, h)) if len(h_n) else ((0.0, 0.0), (0.0, 0.0))
    if fit_g is None or fit_h is None:  # not affine: all heavy experts on the GPU
        zero = np.zeros(1)
        options = [(len(h_n), zero, zero + torch_sum(g), zero + torch_sum(h))]
        return options, (lambda j, s: list(range(len(h_n)))), False
    sums = _SubsetSums(h_n.tolist())
    options = []
    for j, reach in enumerate(sums.reach):
        if reach:
            s = _bits(reach).astype(np.float64)
            options.append((j, s, j * fit_g[0] + fit_g[1] * s, j * fit_h[0] + fit_h[1] * s))
    return options, sums.subset, True


DENSE_CELLS = 4096  # up to this many (s, flat count) pairs, phi is evaluated everywhere


def _min_phi(flat_gpu: np.ndarray, cpu_rest: np.ndarray, heavy_gpu: np.ndarray, heavy_cpu: np.ndarray
             ) -> tuple[float, int, int]:
    """(phi, row, col): the first minimum in row-major order of
    phi[r, c] = max(flat_gpu[c] + heavy_gpu[r], cpu_rest[c] - heavy_cpu[r]), the rows being
    the reachable heavy token sums s (ascending), the columns the flat experts on the GPU.

    Both heavy times grow with s, so in every column the GPU side rises and the CPU side
    falls with the row: the column's minimum sits at the last row before the sides cross
    or the first after, and the first row holding that minimum is where the CPU side
    first drops to it; both rows are searched, then checked with the same float
    operations as the dense phi, so the choice is the dense argmin's."""
    n_rows, n_cols = len(heavy_gpu), len(flat_gpu)
    monotone = bool((heavy_gpu[1:] >= heavy_gpu[:-1]).all() and (heavy_cpu[1:] >= heavy_cpu[:-1]).all())
    if n_rows * n_cols <= DENSE_CELLS or not monotone:
        phi = np.maximum(flat_gpu[None, :] + heavy_gpu[:, None], cpu_rest[None, :] - heavy_cpu[:, None])
        row, col = divmod(int(phi.argmin()), n_cols)
        return float(phi[row, col]), row, col
    cols = np.arange(n_cols)

    def first_row(pred: Callable[[np.ndarray], np.ndarray], guess: np.ndarray) -> np.ndarray:
        """Per column, the first row where the monotone (False..., True...) `pred` holds:
        from a guess (a searchsorted on sums that round like the predicate's, so off by a
        row or two at most), stepped until it is exact; bisection if it is not close."""
        rows = np.clip(guess, 0, n_rows)
        for _ in range(4):
            down = (rows > 0) & pred(np.maximum(rows - 1, 0))
            up = (rows < n_rows) & ~pred(np.minimum(rows, n_rows - 1))
            if not (down.any() or up.any()):
                return rows
            rows = rows - down + up
        lo, hi = np.zeros(n_cols, np.int64), np.full(n_cols, n_rows, np.int64)
        while (open_ := lo < hi).any():
            mid = (lo + hi) // 2
            ok = pred(np.minimum(mid, n_rows - 1))
            hi = np.where(open_ & ok, mid, hi)
            lo = np.where(open_ & ~ok, mid + 1, lo)
        return lo

    def gpu_side(rows: np.ndarray) -> np.ndarray:
        return flat_gpu + heavy_gpu[rows]

    def cpu_side(rows: np.ndarray) -> np.ndarray:
        return cpu_rest - heavy_cpu[rows]

    # the first row where the GPU side dominates: gpu_side >= cpu_side <=> heavy sum >= gap
    both = heavy_gpu + heavy_cpu
    cross = first_row(lambda r: gpu_side(r) >= cpu_side(r), np.searchsorted(both, cpu_rest - flat_gpu))
    before, after = np.maximum(cross - 1, 0), np.minimum(cross, n_rows - 1)
    phi_before = np.where(cross > 0, np.maximum(gpu_side(before), cpu_side(before)), np.inf)
    phi_after = np.where(cross < n_rows, np.maximum(gpu_side(after), cpu_side(after)), np.inf)
    low = np.minimum(phi_before, phi_after)
    # before the crossing phi is the falling CPU side: the first row at the minimum
    plateau = first_row(lambda r: cpu_side(r) <= low, np.searchsorted(heavy_cpu, cpu_rest - low))
    first = np.where(phi_before <= phi_after, plateau, after)
    value = low.min()
    at = cols[low == value]
    col = int(at[np.argmin(first[at])])  # the lowest row, then the lowest column
    return float(value), int(first[col]), col


def best_gpu_set(load: np.ndarray, capacity: int, cost: CostModel) -> tuple[list[int], float, bool]:
    """(G, Phi(G), exact) minimising Phi over subsets of the routed experts."""
    loads = load
    ids = np.flatnonzero(loads > 0)
    n = loads[ids].astype(np.int64)
    top = int(n.max()) if n.size else 0
    g, h = cost.time_table("gpu", top)[n], cost.time_table("cpu", top)[n]
    g1, c1 = cost.gpu_expert_time(1), cost.copy_time(1)
    flat = g == g1
    # flat experts heaviest first (ties to the lower id: ids ascend and the sort is stable)
    order = (-n[flat]).argsort(kind="stable")
    flat_ids = ids[flat][order]
    cpu_saved_flat = np.concatenate([np.zeros(1), h[flat][order].cumsum()])
    k = np.arange(len(flat_ids) + 1, dtype=np.float64)
    heavy_ids = ids[~flat]
    options, subset_of, exact = _heavy_options(n[~flat], g[~flat], h[~flat])
    total_cpu = torch_sum(h)
    best = (float("inf"), 0, 0, 0)  # (phi, j, s, flat experts on the GPU)
    cpu_rest = total_cpu - cpu_saved_flat
    for j, s, heavy_gpu, heavy_cpu in options:
        flat_gpu = c1 * np.maximum(k + j - capacity, 0) + k * g1
        # a bound below every cell of this option (rounding is monotone): skip it when it
        # cannot beat the best so far, which only a strictly lower phi replaces
        if max(flat_gpu.min() + heavy_gpu.min(), cpu_rest.min() - heavy_cpu.max()) >= best[0]:
            continue
        value, row, col = _min_phi(flat_gpu, cpu_rest, heavy_gpu, heavy_cpu)
        if value < best[0]:
            best = (value, j, int(s[row]), col)
    value, j, s, n_flat = best
    heavy = [int(heavy_ids[i]) for i in subset_of(j, s)]
    return sorted(heavy + flat_ids[:n_flat].tolist()), value, exact


class Oracle(System):
    name = "oracle"
    overlap = True

    def __init__(self) -> None:
        super().__init__()
        self.inexact_layers = 0
        self.planned_layers = 0

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.capacity = ctx.experts_per_layer

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        chosen, _, exact = best_gpu_set(load, self.capacity, self.ctx.cost)
        self.planned_layers += 1
        self.inexact_layers += not exact
        gpu = np.zeros(load.shape[0], bool)
        gpu[chosen] = True
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
    heaviest-first (ties to the lower id: both sorts are stable)."""
    routed = np.flatnonzero(loads)
    by_load = routed[np.argsort(-loads[routed], kind="mergesort")]
    rank = np.where(gpu[by_load], np.where(resident[by_load], 0, 1), 2)
    held = np.zeros(loads.shape[0], np.bool_)
    held[by_load[np.argsort(rank, kind="mergesort")[:capacity]]] = True
    cpu, fetch_sync, scratch, evict = masks[0], masks[1], masks[2], masks[3]
    for e in range(loads.shape[0]):
        cpu[e] = loads[e] > 0 and not gpu[e]
        scratch[e] = gpu[e] and not held[e]
        fetch_sync[e] = (held[e] and not resident[e]) or scratch[e]
        evict[e] = resident[e] and not held[e]
