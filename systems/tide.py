"""TIDE: periodic top-B refresh with CPU execution of misses (docs/systems.md).

A refresh happens on the prompt's prefill forward, at step 0 of every block, at every
step of the first generated block, and on denoise steps with step % tau == 0; never on a
'commit' forward. At a refresh, per layer, the target set is the top-B experts by this
step's load (load > 0); target experts not resident are promoted and only as many
non-target residents as needed are demoted, lowest load first (`refresh_residency`, the
same rule the tau* solver replays). Between refreshes no weights move. Misses run on the
CPU, concurrently with the GPU experts (overlap).

migration: sync  promotions are copied before the layer computes (blocking) and the
                 promoted experts compute on the GPU (the reference code);
migration: async promotions are copied in the background while hits run on the GPU and
                 every other routed expert (misses, demoted experts) on the CPU (the
                 paper's Algorithm 1); they serve from the next forward on.
tau: auto        tau* from systems/tide_tau.py over the calibration trace.
tau: random      a tau drawn uniformly from 1..T at the start of every block (seeded by
                 `seed`): the ablation baseline that shows what choosing tau* is worth.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import njit

from harness.accounting.bitsets import pack, popcount, unpack
from harness.accounting.ledger import LayerOutcomes
from harness.common.errors import HarnessError
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import ExpertCosts, PrepareContext, System
from systems.entry import SystemEntry
from systems.tide_tau import TauSolution, solve_tau

MIGRATIONS = ("sync", "async")


@dataclass
class TideConfig:
    name: str = "tide"
    tau: str = "auto"  # auto (tau* from the calibration trace), random (uniform in 1..T per block, seeded) or an int
    migration: str = "sync"  # sync: moves land before the layer computes; async: overlapped with it
    steps_per_block: int | None = None  # T for the tau* search; None: from the trace
    seed: int = 0  # for tau: random
    overlap: bool = True  # the paper's asynchronous CPU misses; false: the reference code's sequential loop


def parse_tau(tau: object) -> int | str | None:
    """'auto' -> None; 'random' -> 'random'; a positive integer (or its string) -> int;
    else HarnessError."""
    if isinstance(tau, str) and tau.strip().lower() == "auto":
        return None
    if isinstance(tau, str) and tau.strip().lower() == "random":
        return "random"
    try:
        value = int(str(tau).strip())
    except ValueError:
        value = 0
    if isinstance(tau, bool) or value < 1 or str(value) != str(tau).strip():
        raise HarnessError(f"system.tau must be 'auto', 'random' or a positive integer (got {tau!r})")
    return value


def refresh_plan(now: np.ndarray, loads: np.ndarray, capacity: int, migration: str) -> tuple[LayerPlan, int]:
    """A refresh: promote this step's top-B, demote only as many residents as needed
    (bool `now` and int64 `loads` [E] as numpy). sync: copies land before
    the layer and the promoted experts compute on the GPU; async: hits run on the GPU,
    everything else on the CPU while the copies proceed. Returns the plan (its moves as
    masks: ascending ids) and how many experts it promotes."""
    sync = migration == "sync"
    masks = np.empty((4, len(loads)), bool)  # filled by the kernel: returning arrays from numba costs more
    n_promoted = refresh_layer(now, loads, capacity, sync, masks)
    gpu, cpu, promote, demote = masks[0], masks[1], masks[2], masks[3]
    if sync:
        return LayerPlan(gpu=gpu, cpu=cpu, fetch_sync=promote, evict=demote), n_promoted
    return LayerPlan(gpu=gpu, cpu=cpu, fetch_async=promote, evict=demote), n_promoted


@njit(cache=True, nogil=True)
def refresh_layer(now: np.ndarray, loads: np.ndarray, capacity: int, sync: bool, masks: np.ndarray) -> int:
    """`refresh_plan`'s masks, compiled (it runs on every layer of a refreshing forward):
    fills masks [4, E] with gpu, cpu, promoted, demoted; returns how many are promoted.
    Twin: tests/kernels/test_tide_kernels.py."""
    after = refreshed(now, loads, capacity)
    n = loads.shape[0]
    gpu, cpu, promote, demote = masks[0], masks[1], masks[2], masks[3]
    n_promoted = 0
    for e in range(n):
        promote[e] = after[e] and not now[e]
        demote[e] = now[e] and not after[e]
        serving = after[e] if sync else now[e] and after[e]
        gpu[e] = loads[e] > 0 and serving
        cpu[e] = loads[e] > 0 and not serving
        n_promoted += promote[e]
    return n_promoted


@njit(cache=True, nogil=True)
def refreshed(now: np.ndarray, loads: np.ndarray, capacity: int) -> np.ndarray:
    """`refresh_residency` of one layer (bool `now`, int64 `loads` [E]), by the batch
    planner's rule (`refresh_bits`, written out for one row): the target is the top-B
    routed experts (load, then lower id, first); residents outside it are demoted only as
    far as the target needs room. Twin: tests/kernels/test_tide_kernels.py."""
    target = top_b_row(loads, capacity)
    n_target = n_leaving = 0
    for e in range(loads.shape[0]):
        n_target += target[e]
        n_leaving += now[e] and not target[e]
    n_demote = n_leaving + n_target - capacity
    after = target.copy()
    if n_demote <= 0:
        after |= now
    elif n_target < capacity:
        # a short target holds every routed expert: demote the lowest ids among the rest
        for e in range(loads.shape[0]):
            if now[e] and not target[e]:
                after[e] = n_demote <= 0
                n_demote -= 1
    return after


@njit(cache=True, nogil=True)
def top_b_row(loads: np.ndarray, capacity: int) -> np.ndarray:
    """`top_b` of one int64 row, by counting: every expert above the threshold load, then
    the lowest ids at it. Twin: tests/kernels/test_tide_kernels.py."""
    n = loads.shape[0]
    routed = loads > 0
    if routed.sum() <= capacity:
        return routed
    counts = np.zeros(loads.max() + 1, np.int64)
    for e in range(n):
        counts[loads[e]] += 1
    threshold, above = loads.max(), 0  # `above`: experts with a load over the threshold
    while above + counts[threshold] < capacity:
        above += counts[threshold]
        threshold -= 1
    target = loads > threshold
    at = capacity - above
    for e in range(n):
        if at > 0 and loads[e] == threshold:
            target[e] = True
            at -= 1
    return target


class Tide(System):
    name = "tide"
    config_class = TideConfig
    overlap = True

    def __init__(self, config: TideConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        tau, migration = self.config.tau, self.config.migration
        steps_per_block, seed = self.config.steps_per_block, self.config.seed
        parsed = parse_tau(tau)
        self.random_tau = parsed == "random"
        self.fixed_tau = parsed if isinstance(parsed, int) else None
        self.rng = random.Random(seed)
        self.tau_per_block: list[int] = []
        if migration not in MIGRATIONS:
            raise HarnessError(f"system.migration must be one of {', '.join(MIGRATIONS)} (got {migration!r})")
        if steps_per_block is not None and (not isinstance(steps_per_block, int) or steps_per_block < 1):
            raise HarnessError(
                f"system.steps_per_block must be a positive integer or null (got {steps_per_block!r})"
            )
        self.migration = migration
        self.steps_per_block = steps_per_block
        self.needs_calibration = self.fixed_tau is None and not self.random_tau
        self.tau = self.fixed_tau or 0
        self.solution: TauSolution | None = None
        self.refreshing = False
        self.refreshes = 0
        self.migrated = 0

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.capacity = ctx.experts_per_layer
        if self.random_tau:
            self.max_tau = self.steps_per_block or ctx.decode_steps
            if not self.max_tau:
                raise HarnessError("system.tau=random needs system.steps_per_block (or the run's decode.steps)")
            self.tau = self.rng.randint(1, self.max_tau)
        elif self.fixed_tau is None:
            self.solution = solve_tau(
                ctx.calibration, ctx.experts_per_layer, ctx.cost, self.steps_per_block, overlap=self.overlap
            )
            self.tau = self.solution.tau_star

    @property
    def tau_star(self) -> int | None:
        """The tau that `prepare` solved from the calibration trace and the cost model
        (tau=auto); None for a fixed or random tau, which no cost model decides."""
        return self.solution.tau_star if self.solution is not None else None

    def should_refresh(self, step: StepInfo) -> bool:
        if step.kind == "commit":
            return False
        if step.kind == "prefill":
            return True
        return step.step == 0 or step.is_first_block or step.step % self.tau == 0

    def on_step(self, step: StepInfo) -> None:
        if self.tau < 1:
            raise RuntimeError("Tide.prepare() must run before the first step")
        if self.random_tau and step.in_block and step.step == 0:
            self.tau = self.rng.randint(1, self.max_tau)
            self.tau_per_block.append(self.tau)
        self.refreshing = self.should_refresh(step)
        self.refreshes += self.refreshing

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        if not self.refreshing:
            routed = load > 0
            return LayerPlan(gpu=routed & resident, cpu=np.greater(routed, resident))
        plan, promoted = refresh_plan(resident, load, self.capacity, self.migration)
        self.migrated += promoted
        return plan

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tau": self.tau,
            "tau_mode": "fixed" if self.fixed_tau else ("random" if self.random_tau else "auto"),
            "migration": self.migration,
            "refreshes": self.refreshes,
            "migrated_experts": self.migrated,
            "tau_star": self.tau_star,
        }
        if self.random_tau:
            out["tau_per_block"] = list(self.tau_per_block)
            out["tau_mean"] = sum(self.tau_per_block) / len(self.tau_per_block) if self.tau_per_block else None
        if self.solution is not None:
            s = self.solution
            out.update(
                tau_star=s.tau_star,
                drift_d=s.drift_d,
                steps_per_block=s.steps_per_block,
                f_curve=s.f_curve,
                lat_curve=s.lat_curve,
                lat_io_curve=s.lat_io_curve,
                lat_cpu_curve=s.lat_cpu_curve,
                c_io_s=s.c_io_s,
                c_cu_s=s.c_cu_s,
                routed_pairs_per_step=s.routed_pairs_per_step,
                tau_objective=s.objective,
            )
        return out


# ---- the batch planner: `Tide.plan` over chunks of forwards ---------------------------
def top_b(load: np.ndarray, capacity: int) -> np.ndarray:
    """`top_b_mask` over the last axis of an int array: the top-`capacity` routed experts
    by load, ties to the lower id (`top_b_row` on every row)."""
    rows = np.ascontiguousarray(load, np.int64).reshape(-1, load.shape[-1])
    return _top_b_rows(rows, capacity).reshape(load.shape)


@njit(cache=True, nogil=True)
def _top_b_rows(rows: np.ndarray, capacity: int) -> np.ndarray:
    """`top_b_row` of every row of an int64 [n, E]. Twin: tests/kernels/test_tide_kernels.py."""
    out = np.empty(rows.shape, np.bool_)
    for r in range(rows.shape[0]):
        out[r] = top_b_row(rows[r], capacity)
    return out


def refresh_bits(resident: np.ndarray, target: np.ndarray, n_target: np.ndarray, capacity: int,
                 n_experts: int) -> np.ndarray:
    """`refresh_residency` on packed rows [L, W] (`n_target`: each target row's size).

    A refresh demotes |resident - target| + |target| - B experts when that is positive: all
    of resident - target when the target is full (|target| = B), so such a row ends as the
    target, and a row that demotes nothing ends as resident | target. Otherwise the target
    is short of B because it holds every routed expert, so the candidates all have load 0
    and `refresh_residency`'s order (lowest load, then lowest id) is the lowest ids."""
    n_demote = popcount(resident & ~target) + n_target - capacity
    demoting = n_demote > 0
    after = np.where(demoting[:, None], target, resident | target)
    partial = np.flatnonzero(demoting & (n_target < capacity))
    if partial.size:
        candidates = unpack(resident[partial] & ~target[partial], n_experts)
        kept = candidates & (np.cumsum(candidates, axis=-1) > n_demote[partial, None])
        after[partial] |= pack(kept)
    return after


class TideBatchPlanner:
    """`Tide.plan` for chunks of forwards (tide's batch planner in systems/registry.py):
    residency carried forward by forward in packed rows; the system's own `on_step` runs
    for every forward (refresh flags, tau draws, the refresh count)."""

    def __init__(self, system: Tide, resident: np.ndarray) -> None:
        self.system, self.n_experts = system, resident.shape[-1]
        self.resident = pack(resident)

    def plan(self, loads: np.ndarray, steps: list[StepInfo]) -> LayerOutcomes:
        system, capacity = self.system, self.system.capacity
        refreshing = np.zeros(len(steps), bool)
        for i, step in enumerate(steps):
            system.on_step(step)
            refreshing[i] = system.refreshing
        targets = np.zeros((len(steps), *self.resident.shape), np.uint64)
        if refreshing.any():
            targets[refreshing] = pack(top_b(loads[refreshing], capacity))
        n_target = popcount(targets)
        # held[i]: residency when forward i starts; held[i + 1]: after its refresh, if any
        held = np.empty((len(steps) + 1, *self.resident.shape), np.uint64)
        held[0] = self.resident
        for i in range(len(steps)):
            held[i + 1] = held[i]
            if refreshing[i]:
                held[i + 1] = refresh_bits(held[i], targets[i], n_target[i], capacity, self.n_experts)
        self.resident = held[-1].copy()
        start, after = held[:-1], held[1:]
        promoted = popcount(after & ~start)
        system.migrated += int(promoted.sum())
        sync = system.migration == "sync"
        routed = loads > 0
        # sync: promotions land before the layer computes and serve it; async: they land in
        # the background, so only experts resident before and after serve on the GPU
        on_gpu = routed & unpack(after if sync else after & start, self.n_experts)
        missed = routed & ~unpack(start, self.n_experts)
        zeros = np.zeros_like(promoted)
        return LayerOutcomes(loads, on_gpu, missed, promoted if sync else zeros, zeros, zeros if sync else promoted)

    def residency(self) -> np.ndarray:
        return unpack(self.resident, self.n_experts)



def decision_key(system: System, cost: ExpertCosts, top: int) -> Hashable:
    """TIDE asks the cost model only through tau* (`Tide.tau_star`; fixed or random tau: never)."""
    assert isinstance(system, Tide)
    return system.tau_star


ENTRY = SystemEntry(
    Tide,
    TideConfig,
    TideBatchPlanner,
    decision_key=decision_key,
    invariant_options=({"tau": 2}, {"tau": 3, "migration": "async"}, {"tau": "auto"}),
    golden_variants={"+async": ("system.migration=async", "system.tau=2"), "+random": ("system.tau=random",)},
    about="TIDE: top-B refresh every tau steps, misses on the CPU.",
)
