"""TIDE: periodic top-B refresh with CPU execution of misses (DESIGN section 7).

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
tau: auto        tau* from harness/tau_solver.py over the calibration trace.
tau: random      a tau drawn uniformly from 1..T at the start of every block (seeded by
                 `seed`): the ablation baseline that shows what choosing tau* is worth.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from harness.errors import HarnessError
from harness.tau_solver import TauSolution, refresh_residency, solve_tau
from systems.base import LayerPlan, PrepareContext, StepInfo, System, resident_mask

MIGRATIONS = ("sync", "async")


@dataclass
class TideConfig:
    name: str = "tide"
    tau: str = "auto"
    migration: str = "sync"
    steps_per_block: int | None = None  # T for the tau* search; None: from the trace
    seed: int = 0  # for tau: random


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


def refresh_plan(now: torch.Tensor, load: torch.Tensor, capacity: int, migration: str) -> LayerPlan:
    """A refresh: promote this step's top-B, demote only as many residents as needed.
    sync: copies land before the layer and the promoted experts compute on the GPU;
    async: hits run on the GPU, everything else on the CPU while the copies proceed."""
    routed = load > 0
    after = refresh_residency(now, load, capacity)
    promote = torch.nonzero(after & ~now).flatten().tolist()
    demote = torch.nonzero(now & ~after).flatten().tolist()
    if migration == "sync":
        return LayerPlan(gpu=routed & after, cpu=routed & ~after, fetch_sync=promote, evict=demote)
    kept = now & after
    return LayerPlan(gpu=routed & kept, cpu=routed & ~kept, fetch_async=promote, evict=demote)


class Tide(System):
    name = "tide"
    overlap = True

    def __init__(
        self, tau: str | int = "auto", migration: str = "sync", steps_per_block: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(tau=tau, migration=migration, steps_per_block=steps_per_block, seed=seed)
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
            self.solution = solve_tau(ctx.calibration, ctx.experts_per_layer, ctx.cost, self.steps_per_block)
            self.tau = self.solution.tau_star

    def should_refresh(self, step: StepInfo) -> bool:
        if step.kind == "commit":
            return False
        if step.kind == "prefill":
            return True
        return step.step == 0 or step.is_first_block or step.step % self.tau == 0

    def on_step(self, step: StepInfo) -> None:
        if self.tau < 1:
            raise RuntimeError("Tide.prepare() must run before the first step")
        if self.random_tau and step.kind == "denoise" and step.step == 0:
            self.tau = self.rng.randint(1, self.max_tau)
            self.tau_per_block.append(self.tau)
        self.refreshing = self.should_refresh(step)
        self.refreshes += self.refreshing

    def plan(
        self, layer: int, load: torch.Tensor, hint: torch.Tensor | None, resident: frozenset[int]
    ) -> LayerPlan:
        routed = load > 0
        now = resident_mask(resident, routed.shape[0])
        if not self.refreshing:
            return LayerPlan(gpu=routed & now, cpu=routed & ~now)
        plan = refresh_plan(now, load, self.capacity, self.migration)
        self.migrated += len(plan.fetch_sync) + len(plan.fetch_async)
        return plan

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tau": self.tau,
            "tau_mode": "fixed" if self.fixed_tau else ("random" if self.random_tau else "auto"),
            "migration": self.migration,
            "refreshes": self.refreshes,
            "migrated_experts": self.migrated,
            "tau_star": None,
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
            )
        return out
