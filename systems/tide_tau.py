"""TIDE's offline choice of the refresh interval tau* (docs/systems.md).

From the calibration trace (denoise forwards only, grouped by (prompt, block)):

    d       = per-step probability that an expert of a layer's top-B set drops out of it:
              sum |S_t \\ S_t+1| / sum |S_t| over consecutive steps of a block, all layers
    f(tau)  = missed / routed token-expert pairs when TIDE's refresh rule (the same
              `refresh_residency` the system runs) fires at block steps s % tau == 0 and
              weights move before the step computes
    C_IO    = cost.copy_time(1): seconds to move one expert
    C_CU    = cost.cpu_expert_time(n) / n at the trace's mean tokens per routed expert n:
              CPU seconds per missed token-expert pair
    P       = mean routed token-expert pairs per (denoise step, MoE layer)

    Lat_IO(tau)  = C_IO * B * (T / tau) * (1 - (1 - d)^tau)
    Lat_CPU(tau) = C_CU * T * P * f(tau)
    Lat(tau)     = Lat_IO + Lat_CPU                      (overlap=None: the paper's objective)
    tau*         = argmin over tau in 1..T of Lat(tau) (the smallest on ties)

With `overlap` given (TIDE passes its own), Lat(tau) is instead the expert time the ledger
charges TIDE's layers with, from the same replay of the refresh rule over the trace: per
(step, layer) io = C_IO x promoted experts (sync migration: on the GPU path), gpu = the GPU
experts' seconds, cpu = the missed experts' seconds, combined as the ledger combines them,
max(io + gpu, cpu) when overlapping and io + gpu + cpu when not, summed and given per block
per layer. The combine must be applied per layer-step, not to the aggregated Lat_IO and
Lat_CPU: a sync refresh copies on the steps where the refreshed layer misses nothing, and
misses accumulate on the steps in between, so the copies and the CPU work of TIDE never
share a step, and max(Lat_IO, Lat_CPU) would count the copies as hidden when they never
are (measured: tau* 22% off the best replayed tau on a drifting trace, tests/unit/test_tau_solver.py).

Both terms are seconds per block per MoE layer. The first design wrote B where we use P in
Lat_CPU: f is a fraction of routed pairs, so the missed pairs per step are f * P; with B
the two terms would not be in the same unit. T = steps per block, the longest block in
the trace unless given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from harness.accounting.bitsets import pack, unpack
from harness.common.errors import HarnessError

if TYPE_CHECKING:
    from harness.accounting.cost import CostModel
    from harness.placement.trace import RoutingTrace


def top_b_mask(load: torch.Tensor, capacity: int) -> torch.Tensor:
    """The top-`capacity` experts by load among the routed ones (load > 0), ties to the
    lower id; works on [E] or [..., E]."""
    n_experts = load.shape[-1]
    order = torch.sort(load, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(n_experts).expand_as(order).contiguous())
    return (ranks < capacity) & (load > 0)


def refresh_residency(resident: torch.Tensor, load: torch.Tensor, capacity: int) -> torch.Tensor:
    """TIDE's refresh: promote every target (top-B) expert that is not resident and
    demote only as many non-target residents as needed, lowest load first (then lowest
    id). bool [..., E] -> bool [..., E].
    Reference definition: only tests call this: the solver and the policy run
    `refresh_to_target` and `refreshed`, held to it."""
    ids = torch.arange(load.shape[-1])
    return refresh_to_target(resident, top_b_mask(load, capacity), load.long() * load.shape[-1] + ids, capacity)


def refresh_to_target(resident: torch.Tensor, target: torch.Tensor, demote_key: torch.Tensor,
                      capacity: int) -> torch.Tensor:
    """`refresh_residency` given its target (top-B mask) and demotion key (load * E + id):
    callers that refresh many times over the same loads compute both once."""
    n_experts = target.shape[-1]
    promote = target & ~resident
    spare = capacity - resident.sum(-1)
    n_demote = (promote.sum(-1) - spare).clamp(min=0)
    candidates = resident & ~target
    ids = torch.arange(n_experts)
    key = torch.where(candidates, demote_key, torch.iinfo(torch.long).max)
    order = torch.argsort(key, dim=-1, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, ids.expand_as(order).contiguous())
    demote = candidates & (ranks < n_demote.unsqueeze(-1))
    return (resident & ~demote) | target


def denoise_blocks(trace: RoutingTrace) -> list[torch.Tensor]:
    """Loads [steps, L, E] of every (prompt, block), denoise forwards in step order."""
    loads = trace.loads
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, step in enumerate(trace.steps):
        if step.in_block:
            groups.setdefault((step.prompt, step.block), []).append((step.step, i))
    return [loads[[i for _, i in sorted(rows)]] for rows in groups.values()]


def estimate_drift(blocks: list[torch.Tensor], capacity: int) -> float:
    dropped = kept_total = 0
    for block in blocks:
        sets = top_b_mask(block, capacity)  # [steps, L, E]
        dropped += int((sets[:-1] & ~sets[1:]).sum())
        kept_total += int(sets[:-1].sum())
    return dropped / kept_total if kept_total else 0.0


def miss_fraction(blocks: list[torch.Tensor], capacity: int, tau: int) -> float:
    """f(tau): TIDE's refresh rule replayed over the blocks, residency carried across
    blocks from the engine's default start (experts 0..B-1 of every layer).
    Reference definition: only tests call this (`solve_tau` runs `RefreshReplay` for every tau at once)."""
    if not blocks:
        return 0.0
    missed, routed, _ = RefreshReplay(blocks, capacity).run(tau)
    return missed / routed if routed else 0.0


class RefreshWindows:
    """What TIDE's refresh every tau steps does over calibration blocks (loads [steps, L, E]),
    independent of any cost model: per tau, the residency each step computes with (the
    last refresh's), how many experts each refresh promotes, and the missed pairs. Each
    tau's is replayed once and kept, so solving tau* again under another cost model (the
    sensitivity analysis re-solves it for every scaled profile) only charges."""

    def __init__(self, blocks: list[torch.Tensor], capacity: int) -> None:
        self.capacity = capacity
        self.n_layers, self.n_experts = blocks[0].shape[1:]
        self.loads = [block.long() for block in blocks]
        self.targets = [top_b_mask(loads, capacity) for loads in self.loads]
        ids = torch.arange(self.n_experts)
        self.demote_keys = [loads * self.n_experts + ids for loads in self.loads]  # lowest load, then id
        self.routed_pairs = sum(int(loads.sum()) for loads in self.loads)
        self._by_tau: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self._every = torch.cat(self.loads)
        self.top = int(self._every.max()) if self._every.numel() else 0
        self._seconds: dict[tuple[Any, ...], torch.Tensor] = {}  # distinct rows' sums, bounded: SECONDS_KEPT
        self._rows: DistinctRows | None = None
        self._per_expert: dict[bool, tuple[bytes, torch.Tensor]] = {}

    def refresh(self, resident: torch.Tensor, block: int, step: int) -> torch.Tensor:
        """`refresh_residency(resident, loads of that step, capacity)`, from the precomputed
        target and demotion keys."""
        return refresh_to_target(resident, self.targets[block][step], self.demote_keys[block][step], self.capacity)

    def at(self, tau: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(residency bool [S, L, E] of every step of every block in order, experts promoted
        int64 [S, L] (at each refresh's step, 0 elsewhere), missed pairs), residency carried
        across blocks from the engine's default start (experts 0..B-1 of every layer)."""
        if tau not in self._by_tau:
            resident = torch.zeros(self.n_layers, self.n_experts, dtype=torch.bool)
            resident[:, : min(self.capacity, self.n_experts)] = True
            serving, promoted, missed = [], [], 0
            for b, loads in enumerate(self.loads):
                held = torch.empty(loads.shape, dtype=torch.bool)
                moved = torch.zeros(loads.shape[:2], dtype=torch.long)
                for start in range(0, loads.shape[0], tau):
                    after = self.refresh(resident, b, start)
                    held[start : start + tau] = after
                    moved[start] = (after & ~resident).sum(-1)
                    missed += int((loads[start : start + tau] * ~after).sum())
                    resident = after
                serving.append(held)
                promoted.append(moved)
            self._by_tau[tau] = (torch.cat(serving), torch.cat(promoted), missed)
        return self._by_tau[tau]

    def layer_seconds(self, tau: int, table: torch.Tensor, on_gpu: bool) -> torch.Tensor:
        """float64 [S, L]: per step and layer, the summed seconds (`table` by load) of the
        routed experts it serves on the GPU (on_gpu) or misses (else), refreshing every tau
        steps. Each sum is the torch sum of the layer's row of where(served, seconds, 0)
        (misses: where(served, 0, seconds)); a row depends only on the step, the layer and
        which routed experts are served, so it is summed once for every tau that serves the
        same (`DistinctRows`), and kept by the table's values: a cost model that changes
        only the other device or the link reuses them."""
        rows = self._distinct_rows(tau)
        key = (on_gpu, table[: self.top + 1].numpy().tobytes())
        if key not in self._seconds:
            per = self._per_expert.get(on_gpu)
            if per is None or per[0] != key[1]:  # one [S, L, E] table per device: the last one asked for
                per = self._per_expert[on_gpu] = (key[1], torch.where(self._every > 0, table[self._every], 0.0))
            self._seconds[key] = rows.sums(per[1], on_gpu)
            while len(self._seconds) > SECONDS_KEPT:
                self._seconds.pop(next(iter(self._seconds)))
        return self._seconds[key][rows.inverse[tau - 1]].reshape(self._every.shape[:2])

    def _distinct_rows(self, tau: int) -> DistinctRows:
        """The distinct (step, layer, served experts) rows of taus 1..max(tau, longest block)."""
        taus = max(tau, max(loads.shape[0] for loads in self.loads))
        if self._rows is None or self._rows.taus < taus:
            self._rows = DistinctRows([self.at(t)[0] for t in range(1, taus + 1)], self._every > 0)
            self._seconds.clear()
        return self._rows


class DistinctRows:
    """The (step, layer) rows of TIDE's residency for taus 1..T (bool [S, L, E] each), as
    the distinct (row, served routed experts) pairs: most taus serve a given step from the
    same refresh (with a full top-B target a refresh leaves exactly the target), so there
    are a few times fewer distinct rows than T x S x L, and each is summed once."""

    CHUNK = 8192  # rows gathered at a time: bounds the [rows, E] float64 temporaries

    def __init__(self, serving: list[torch.Tensor], routed: torch.Tensor) -> None:
        self.taus = len(serving)
        n_experts = routed.shape[-1]
        n_rows = routed.shape[0] * routed.shape[1]
        words = np.stack([pack((held & routed).reshape(n_rows, n_experts).numpy()) for held in serving])
        keyed = np.concatenate([np.broadcast_to(np.arange(n_rows)[None, :, None], (*words.shape[:2], 1)),
                                words.view(np.int64)], -1).reshape(self.taus * n_rows, -1)
        _, first, inverse = np.unique(keyed, axis=0, return_index=True, return_inverse=True)
        self.inverse = torch.from_numpy(inverse.reshape(self.taus, n_rows))
        self.rows = torch.from_numpy(first % n_rows)  # each distinct row's (step, layer), flattened
        self.served = torch.from_numpy(unpack(words.reshape(self.taus * n_rows, -1)[first], n_experts))

    def sums(self, per_expert: torch.Tensor, on_gpu: bool) -> torch.Tensor:
        """float64 [distinct rows]: the torch sum of each row of per_expert [S, L, E] over its
        served (on_gpu) or other experts, the rest as 0.0, as `layer_seconds` defines them."""
        flat = per_expert.reshape(-1, per_expert.shape[-1])
        out = torch.empty(len(self.rows), dtype=torch.float64)
        for first in range(0, len(self.rows), self.CHUNK):
            part = slice(first, first + self.CHUNK)
            values, served = flat[self.rows[part]], self.served[part]
            kept = torch.where(served, values, 0.0) if on_gpu else torch.where(served, 0.0, values)
            out[part] = kept.sum(-1)
        return out


SECONDS_KEPT = 16  # tables whose distinct rows' sums are kept per calibration trace


class RefreshReplay:
    """TIDE's refresh every tau steps replayed over calibration blocks (loads [steps, L, E]),
    for any tau: the cost-free part from `RefreshWindows` (shared: `windows`), and with a cost
    model each routed expert's GPU and CPU seconds, charged for all steps at a time."""

    def __init__(self, blocks: list[torch.Tensor], capacity: int, cost: CostModel | None = None,
                 windows: RefreshWindows | None = None) -> None:
        self.windows = windows or RefreshWindows(blocks, capacity)
        self.capacity, self.n_layers, self.n_experts = capacity, self.windows.n_layers, self.windows.n_experts
        self.loads = self.windows.loads
        self.routed_pairs = self.windows.routed_pairs
        self.cost = cost
        if cost is not None:
            top = self.windows.top
            self.gpu_table = torch.from_numpy(cost.time_table("gpu", top))
            self.cpu_table = torch.from_numpy(cost.time_table("cpu", top))

    def run(self, tau: int, overlap: bool = True) -> tuple[int, int, float]:
        """(missed pairs, routed pairs, charged expert seconds per block per layer) with a
        refresh every tau steps; the charge (0.0 without a cost model) combines each
        layer-step's copies + GPU experts with its CPU experts as the ledger does (max when
        overlapped, else the sum), and adds the steps' layer sums one step at a time, in order."""
        _, promoted, missed = self.windows.at(tau)
        total = 0.0
        if self.cost is not None:
            io = promoted.double() * self.cost.copy_time(1)  # 0.0 where nothing was promoted
            gpu = self.windows.layer_seconds(tau, self.gpu_table, on_gpu=True)
            cpu = self.windows.layer_seconds(tau, self.cpu_table, on_gpu=False)
            layer = torch.maximum(io + gpu, cpu) if overlap else io + gpu + cpu
            for step_s in layer.sum(-1).tolist():
                total += step_s
        return missed, self.routed_pairs, total / (len(self.loads) * self.n_layers)


@dataclass(frozen=True)
class TauSolution:
    tau_star: int
    steps_per_block: int
    experts_per_layer: int
    drift_d: float
    c_io_s: float
    c_cu_s: float
    routed_pairs_per_step: float
    f_curve: list[float]  # f(tau) for tau = 1..T
    lat_io_curve: list[float]
    lat_cpu_curve: list[float]
    lat_curve: list[float]
    objective: str = "paper"  # what lat_curve is: paper (Lat_IO + Lat_CPU) | charged-overlap | charged-sequential

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def latency_curves(
    d: float, f_curve: list[float], capacity: int, steps: int, c_io: float, c_cu: float, pairs: float
) -> tuple[list[float], list[float]]:
    taus = range(1, len(f_curve) + 1)
    lat_io = [c_io * capacity * (steps / tau) * (1.0 - (1.0 - d) ** tau) for tau in taus]
    lat_cpu = [c_cu * steps * pairs * f for f in f_curve]
    return lat_io, lat_cpu


@dataclass
class _Calibration:
    """What tau* takes from a calibration trace besides the cost model, kept on the trace
    (`RoutingTrace.memo`) so that another solve over it (another cost model) only charges."""

    blocks: list[torch.Tensor]
    drift: float
    windows: RefreshWindows | None
    routed_experts: int
    pairs_total: int
    rows: int  # (denoise step, MoE layer) pairs


def _calibration(trace: RoutingTrace, capacity: int) -> _Calibration:
    key = ("tide_calibration", capacity)
    if key not in trace.memo:
        blocks = denoise_blocks(trace)
        if not blocks:
            return _Calibration([], 0.0, None, 0, 0, 0)
        all_loads = torch.cat(blocks).long()
        trace.memo[key] = _Calibration(blocks, estimate_drift(blocks, capacity), RefreshWindows(blocks, capacity),
                                       int((all_loads > 0).sum()), int(all_loads.sum()),
                                       all_loads.shape[0] * all_loads.shape[1])
    return trace.memo[key]


def solve_tau(
    trace: RoutingTrace | None, capacity: int, cost: CostModel, steps_per_block: int | None = None,
    overlap: bool | None = None,
) -> TauSolution:
    """tau* for a system with `capacity` experts per layer; overlap None: the paper's
    objective Lat_IO + Lat_CPU; True/False: the charged objective (module docstring)."""
    if trace is None or not (calibration := _calibration(trace, capacity)).blocks:
        raise HarnessError("tide tau=auto needs a calibration trace with denoise steps; set system.tau=<int>")
    blocks, d, windows = calibration.blocks, calibration.drift, calibration.windows
    steps = steps_per_block or max(block.shape[0] for block in blocks)
    if steps < 1:
        raise HarnessError(f"system.steps_per_block must be >= 1 (got {steps})")
    routed_experts, pairs_total, n_rows = calibration.routed_experts, calibration.pairs_total, calibration.rows
    mean_tokens = max(1, round(pairs_total / routed_experts)) if routed_experts else 1
    c_cu = cost.cpu_expert_time(mean_tokens) / mean_tokens
    pairs = pairs_total / n_rows
    replay = RefreshReplay(blocks, capacity, None if overlap is None else cost, windows)
    runs = [replay.run(tau, bool(overlap)) for tau in range(1, steps + 1)]
    f_curve = [missed / routed if routed else 0.0 for missed, routed, _ in runs]
    lat_io, lat_cpu = latency_curves(d, f_curve, capacity, steps, cost.copy_time(1), c_cu, pairs)
    if overlap is None:
        lat = [a + b for a, b in zip(lat_io, lat_cpu, strict=True)]
    else:
        lat = [charged for _, _, charged in runs]
    tau_star = min(range(1, steps + 1), key=lambda tau: (lat[tau - 1], tau))
    return TauSolution(
        tau_star=tau_star,
        steps_per_block=steps,
        experts_per_layer=capacity,
        drift_d=d,
        c_io_s=cost.copy_time(1),
        c_cu_s=c_cu,
        routed_pairs_per_step=pairs,
        f_curve=f_curve,
        lat_io_curve=lat_io,
        lat_cpu_curve=lat_cpu,
        lat_curve=lat,
        objective="paper" if overlap is None else ("charged-overlap" if overlap else "charged-sequential"),
    )
