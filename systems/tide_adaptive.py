"""TIDE with the refresh interval chosen online, per block, without a calibration pass.

Refreshes follow TIDE (systems/tide.py): the prompt's prefill forward, step 0 of every
block and every step of the first generated block refresh (`refresh_residency`: promote
this step's top-B, demote only as many others as needed, lowest load first); commit
forwards never do; misses run on the CPU, concurrently with the GPU. The difference is
when the other refreshes happen. TIDE fixes tau offline from a calibration trace; here
every denoise step of a block measures, with the cost model, what the residency left by
the last refresh costs against a fresh one, and the next refresh comes when that
accumulated cost has paid for one (rent or buy):

    per layer, at this step's load:
    stale  = max(GPU time of the resident routed experts, CPU time of the others)
    fresh  = the same with this step's top-B resident (a refresh now, its copies free)
    regret = max(0, stale - fresh)               what not refreshing cost this step
    buy    = copy_time(1) * |top-B not resident| what a refresh now would copy (sync)

    refresh at step s when the regret summed over the steps since the last refresh,
    plus step s's predicted regret, reaches the buy price; both are the last step's
    (staleness only grows), or right after a refresh (nothing observed since) those of
    the step after the previous refresh

The regret grows with the miss growth: slowly when the routing drifts slowly or only
oscillates around the top-B cut (those experts cost little on the CPU), fast when the
hot set moves. Rent-or-buy is the classic online rule for this trade (buy once the rent
paid reaches the price: at most about twice what the better of "refresh now" and "never
refresh" would have paid over an interval); counting the coming step's predicted rent
lets fast drift refresh every step instead of every other one.

The tau of a block is its steps per refresh (step 0's included): the interval TIDE would
need to refresh as often. The report gives it for every block but the first generated
one (which refreshes every step), and the mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import njit

from harness.accounting.cost import CostModel
from harness.accounting.ordered_sums import table_row_sums, torch_sum
from harness.common.errors import HarnessError
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import PrepareContext, System
from systems.entry import SystemEntry
from systems.tide import MIGRATIONS, refresh_plan, top_b


@dataclass
class TideAdaptiveConfig:
    name: str = "tide_adaptive"
    migration: str = "sync"  # sync | async, as tide
    overlap: bool = True  # as tide


@dataclass
class StepTally:
    """One forward, summed over its MoE layers (seconds from the cost model)."""

    regret_s: float = 0.0
    buy_s: float = 0.0
    layers: int = 0


def layer_regret(
    loads: np.ndarray, resident: np.ndarray, capacity: int, gpu: np.ndarray, cpu: np.ndarray, copy_s: float
) -> tuple[float, float]:
    """(regret, buy) of one layer: what keeping `resident` costs over this step's top-B
    resident, and what copying the missing top-B would cost. gpu / cpu: each expert's
    times at this load (float64 [E]); each side's seconds are the torch sum of its times
    in id order.
    Reference definition: only tests call this: the policy prices a forward's layers at once
    (`forward_regrets`), held to this bit for bit."""
    routed = loads > 0
    top = top_b(loads, capacity)
    # np.greater(a, b) on bool masks is a & ~b in one pass (this runs every layer of every step)
    stale = max(torch_sum(gpu[routed & resident]), torch_sum(cpu[np.greater(routed, resident)]))
    fresh = max(torch_sum(gpu[top]), torch_sum(cpu[np.greater(routed, top)]))
    return max(0.0, stale - fresh), copy_s * int(np.count_nonzero(np.greater(top, resident)))


def forward_regrets(loads: np.ndarray, resident: np.ndarray, capacity: int, cost: CostModel
                    ) -> tuple[np.ndarray, np.ndarray]:
    """`layer_regret` of every row of int [n, E] loads and bool [n, E] residencies at once,
    to the same bits: each side's seconds are the torch sums of its times in id order
    (`table_row_sums`, as the ledger charges them)."""
    top = top_b(loads, capacity)
    sizes = _side_sizes(loads, resident, top)  # per row: the experts on each side of stale and fresh
    biggest = int(loads.max()) if loads.size else 0

    def seconds(device: str, mask: Callable[[], np.ndarray], lengths: np.ndarray) -> np.ndarray:
        return table_row_sums(cost.time_table(device, biggest), loads, mask, lengths, biggest)

    stale = np.maximum(seconds("gpu", lambda: (loads > 0) & resident, sizes[0]),
                       seconds("cpu", lambda: np.greater(loads > 0, resident), sizes[1]))
    fresh = np.maximum(seconds("gpu", lambda: top, sizes[2]),
                       seconds("cpu", lambda: np.greater(loads > 0, top), sizes[3]))
    return np.maximum(0.0, stale - fresh), cost.copy_time(1) * sizes[4]


@njit(cache=True, nogil=True)
def _side_sizes(loads: np.ndarray, resident: np.ndarray, top: np.ndarray) -> np.ndarray:
    """int64 [5, n]: per row, the routed experts resident and not, the top-B, the routed
    ones outside it, and the top-B not resident (one pass instead of five masks).
    Twin: tests/kernels/test_tide_adaptive_kernels.py."""
    n, experts = loads.shape
    sizes = np.zeros((5, n), np.int64)
    for r in range(n):
        for e in range(experts):
            if loads[r, e] > 0:
                if resident[r, e]:
                    sizes[0, r] += 1
                else:
                    sizes[1, r] += 1
                if top[r, e]:
                    sizes[2, r] += 1
                    if not resident[r, e]:
                        sizes[4, r] += 1
                else:
                    sizes[3, r] += 1
    return sizes


class TideAdaptive(System):
    name = "tide_adaptive"
    config_class = TideAdaptiveConfig
    overlap = True

    def __init__(self, config: TideAdaptiveConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        migration = self.config.migration
        if migration not in MIGRATIONS:
            raise HarnessError(f"system.migration must be one of {', '.join(MIGRATIONS)} (got {migration!r})")
        self.migration = migration
        self.refreshing = False
        self.current: StepInfo | None = None
        self.tally = StepTally()
        self.regret_s = 0.0  # accumulated since the block's last refresh
        self.fresh = True  # no step observed since the last refresh
        self.last = StepTally()  # the last observed step since the refresh
        self.first = StepTally()  # the step after the latest refresh that had one
        self.block: tuple[int, int] | None = None
        self.adaptive_block = False
        self.block_steps = self.block_refreshes = 0
        self.tau_per_block: list[float] = []
        self.refreshes = 0
        self.migrated = 0
        self.seen_loads, self.seen_held, self.n_seen = np.zeros((0, 0), np.int64), np.zeros((0, 0), bool), 0

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.capacity = ctx.experts_per_layer
        # the open denoise forward's layers (load, residency), priced together when it closes
        shape = (ctx.geometry.n_moe_layers, ctx.geometry.num_experts)
        self.seen_loads, self.seen_held, self.n_seen = np.zeros(shape, np.int64), np.zeros(shape, bool), 0

    # ---- per forward ---------------------------------------------------------------
    def on_step(self, step: StepInfo) -> None:
        self._close_step()
        if step.in_block and (step.prompt, step.block) != self.block:
            self._start_block(step)
        self.refreshing = self.should_refresh(step)
        self.refreshes += self.refreshing
        if step.in_block:
            self.block_steps += 1
            self.block_refreshes += self.refreshing
            if self.refreshing:
                self.regret_s, self.fresh = 0.0, True
        self.current = step

    def should_refresh(self, step: StepInfo) -> bool:
        if not step.in_block:
            return step.kind == "prefill"
        if step.step == 0 or step.is_first_block:
            return True
        seen = self.first if self.fresh else self.last
        return self.regret_s + seen.regret_s > 0 and self.regret_s + seen.regret_s >= seen.buy_s

    def _start_block(self, step: StepInfo) -> None:
        self._finish_block()
        self.block = (step.prompt, step.block)
        self.adaptive_block = not step.is_first_block
        self.block_steps = self.block_refreshes = 0

    def _finish_block(self) -> None:
        if self.adaptive_block and self.block_refreshes:
            self.tau_per_block.append(round(self.block_steps / self.block_refreshes, 2))
        self.adaptive_block = False

    def _close_step(self) -> None:
        """Fold the finished denoise forward into the regret since the last refresh (a
        refresh step is fresh by construction: it adds nothing)."""
        self._price_observed()
        step, t = self.current, self.tally
        self.tally = StepTally()
        if step is None or not step.in_block or t.layers == 0:
            return
        if self.refreshing:
            return
        if self.fresh:
            self.first, self.fresh = t, False
        self.last = t
        self.regret_s += t.regret_s

    # ---- one layer -----------------------------------------------------------------
    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        if self.current is not None and self.current.in_block:
            self._observe(load, resident)
        if not self.refreshing:
            routed = load > 0
            return LayerPlan(gpu=routed & resident, cpu=np.greater(routed, resident))
        plan, promoted = refresh_plan(resident, load, self.capacity, self.migration)
        self.migrated += promoted
        return plan

    def _observe(self, loads: np.ndarray, now: np.ndarray) -> None:
        """Keep this layer's load and residency; the forward's layers are priced together
        when it closes (only the next step's decision reads them)."""
        if self.n_seen == len(self.seen_loads):  # more layers than the geometry's: room for one more
            self.seen_loads = np.concatenate([self.seen_loads, self.seen_loads[:1]])
            self.seen_held = np.concatenate([self.seen_held, self.seen_held[:1]])
        self.seen_loads[self.n_seen] = loads
        self.seen_held[self.n_seen] = now
        self.n_seen += 1

    def _price_observed(self) -> None:
        """Fold the kept layers into the open tally, layer after layer as `layer_regret` would."""
        n, self.n_seen = self.n_seen, 0
        if not n:
            return
        regrets, buys = forward_regrets(self.seen_loads[:n], self.seen_held[:n], self.capacity, self.ctx.cost)
        for regret, buy in zip(regrets.tolist(), buys.tolist(), strict=True):
            self.tally.regret_s += regret
            self.tally.buy_s += buy
        self.tally.layers += n

    def report(self) -> dict[str, Any]:
        self._close_step()
        self._finish_block()
        taus = self.tau_per_block
        return {
            "migration": self.migration,
            "tau_per_block": list(taus),
            "tau_mean": sum(taus) / len(taus) if taus else None,
            "refreshes": self.refreshes,
            "migrated_experts": self.migrated,
        }


ENTRY = SystemEntry(TideAdaptive, TideAdaptiveConfig, invariant_options=({}, {"migration": "async"}),
                    about="TIDE choosing tau per block online, without calibration.")
