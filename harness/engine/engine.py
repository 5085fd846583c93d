"""The offload engine: residency per MoE layer, plan validation, charging, execution.

A system only answers `plan(layer, load, hint, resident)`; the engine owns residency
(per layer a bool mask of at most B experts on the GPU), checks every plan against the rules
(harness/engine/plan_rules.py), applies it, and records what it implies in its ledger
(harness/accounting/ledger.py: counters, the forward timeline of the cost model, the step series,
charged in batches of forwards). It needs no weights: `plan_layer` is the
replay API, and `run_experts` (the live MoE layer's entry) adds the numerics.

One layer is two halves, `plan_layer(layer, load, hint) = decide + account`:

    plan, pending = engine.decide(layer, load, hint)   # System.plan, validation, residency
    ...                                                 # an executor launches the GPU work
    engine.account(pending)                             # the layer's outcome into the ledger

`decide` does everything an executor needs before it runs the layer: it records the
trace, asks the system, checks the plan and moves residency (this layer's and, for a
prefetch, the next one's), so `resident` already holds the layer's outcome when it
returns. `account` records the layer's outcome in the ledger (a few array writes); it
reads nothing `decide` has not fixed, so an executor may run it while the GPU kernels
run. At most one layer is pending: `decide` refuses while one is, and `end_step` refuses
to close a forward with one. Results are the same bits whichever way a layer is driven.

Host time (`host_seconds()`: inside `System.plan` and the engine's own, per layer) is
wall-clock, so never in `summary()`, which runs compare exactly. A missed pair is a routed
token-expert pair whose expert was not resident when the layer started (free moves, the
oracle's: after them); io_bytes counts every charged host->GPU copy.

Speed: this runs on every layer of every forward, between the router and the experts, so
it touches torch at most once (the live load's numpy view) and then works on numpy: a bool
[layers, E] residency (systems read their row and the load through read-only views), plans
of masks (or ids), a ledger that charges a batch of forwards at once, and compiled per-layer
loops (numba: `layer_rules`, the ledger's tallies and clock; float operations in order).

Lossless: `run_experts` computes every routed expert with one call of
`compute_routed_experts` in the fixed order the MoE layer gave, so on one device every placement gives the
bits of gpu_only; placement changes only what is charged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np
import torch

from harness.accounting.cost import CostModel
from harness.accounting.ledger import Counters, Ledger
from harness.accounting.topology import SINGLE, Topology, check_system_topology
from harness.engine.plan_rules import NO_MOVES, Moves, PlanError, PlanRules
from harness.model.experts import ExpertWeights, compute_routed_experts, expert_load
from harness.model.hints import HINT_CHANNELS, HintFn
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.system import MoEGeometry, PrepareContext, System
from harness.placement.trace import RoutingTrace

__all__ = ["OffloadEngine", "PendingLayer", "PlanError"]  # PlanError lives in harness/engine/plan_rules.py

_NO_COPIES: tuple[tuple[int, int], ...] = ()  # a plan that issues no async copy
_NAN = float("nan")
Hints = torch.Tensor | Mapping[str, torch.Tensor] | None  # decide's hint: the system's channel's, or every channel's
_INT64 = np.dtype(np.int64)


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


@dataclass(eq=False, slots=True)
class PendingLayer:
    """A layer `OffloadEngine.decide` has decided (plan checked, residency moved) and
    `OffloadEngine.account` has still to record. Read-only for callers."""

    layer: int
    plan: LayerPlan
    loads: np.ndarray  # int64 [E]: tokens routed to each expert (a view of the load decide took)
    gpu: np.ndarray  # bool [E]: experts computed on the GPU (every other routed one: the CPU)
    missed: np.ndarray  # bool [E]: routed experts not resident when the layer started (free moves: after them)
    n_scratch: int
    n_cached_sync: int  # sync fetches that stay resident
    async_targets: Sequence[tuple[int, int]]  # (layer, expert) copies issued
    plan_s: float = 0.0  # host seconds inside System.plan
    engine_s: float = 0.0  # host seconds of decide's own work


class OffloadEngine:
    """Implements the `ExpertEngine` protocol of harness/model/experts.py."""

    def __init__(
        self,
        system: System,
        geometry: MoEGeometry,
        experts_per_layer: int,
        cost: CostModel,
        trace: RoutingTrace | None = None,
        topology: Topology | None = None,
        budget_scope: str = "per_layer",
    ) -> None:
        self.system = system
        # topology=multi: expert parallelism, every expert resident on the GPU its plan.device
        # names, nothing offloaded; a layer is charged as its slowest GPU (harness/accounting/topology.py)
        self.topology = topology or SINGLE
        self._multi = self.topology.multi
        check_system_topology(system.name, system.multi_gpu, self.topology)
        self.geometry = geometry
        self.n_layers = geometry.n_moe_layers
        self.n_experts = geometry.num_experts
        self.experts_per_layer = experts_per_layer
        # gpu_only ignores the budget: it is the all-resident reference, not an offloader.
        self.capacity = self.n_experts if system.ignores_budget else experts_per_layer
        # budget.scope=global: B x layers experts in total, any split; a layer may hold all of its own
        self.budget_scope = budget_scope
        self.total_capacity = (experts_per_layer * self.n_layers
                               if budget_scope == "global" and not system.ignores_budget else None)
        layer_capacity = self.n_experts if self.total_capacity is not None else self.capacity
        self.rules = PlanRules(system.name, self.n_experts, self.n_layers, layer_capacity, self.topology)
        self._n_resident = 0  # experts resident over all layers (kept under a global budget)
        self.cost = cost
        self.trace = trace
        # a recorded trace carries next-layer hints of every channel so that replays of
        # hint-using systems (prefetching) see what they would have seen live
        self.record_hints = trace is not None
        # the channels a live layer computes: every one when recording, else the system's own
        self.hint_channels: tuple[str, ...] = (
            HINT_CHANNELS if self.record_hints else (system.hint_channel,) if system.wants_hint else ())
        # the residency: per layer a bool mask of the experts on the GPU, and their count;
        # `System.plan` reads its layer's row through a read-only view (made once)
        self._held = np.zeros((self.n_layers, self.n_experts), bool)
        self._counts = [0] * self.n_layers
        self._views = [_read_only(row) for row in self._held]
        self.ledger = Ledger(cost, self.n_layers, self.n_experts, system.overlap, system.max_loads_in_flight)
        self._step: StepInfo | None = None
        self._rows = 0  # layers recorded in the open forward
        self._landings: dict[int, dict[int, tuple[int, int]]] = {}  # layer -> expert -> (row, copies)
        self._prepared = False
        self._pending: PendingLayer | None = None  # decided, not yet accounted
        self._host_plan_s = self._host_engine_s = 0.0
        self._host_layer_steps = 0

    # ---- lifecycle ---------------------------------------------------------------------
    def prepare(self, calibration: RoutingTrace | None, decode_steps: int | None = None) -> None:
        ctx = PrepareContext(
            self.geometry, self.experts_per_layer, self.cost, calibration, topology=self.topology,
            decode_steps=decode_steps, budget_scope=self.budget_scope,
        )
        self.system.prepare(ctx)
        initial = self.system.initial_residency(self.n_layers, self.n_experts, self.capacity)
        self.rules.check_initial(initial)
        self.resident = [set(experts) for experts in initial]
        self._check_total(-1)
        self._prepared = True

    @property
    def resident(self) -> list[set[int]]:
        """Per MoE layer, the experts on the GPU (a copy, built on each call)."""
        return [set(np.flatnonzero(row).tolist()) for row in self._held]

    @resident.setter
    def resident(self, sets: list[set[int]]) -> None:
        self._held[:] = False
        for layer, experts in enumerate(sets):
            self._held[layer, list(experts)] = True
        self._counts = [len(experts) for experts in sets]
        self._n_resident = sum(self._counts)

    def layer_resident(self, layer: int) -> set[int]:
        """The experts on the GPU in one MoE layer (a copy)."""
        return set(np.flatnonzero(self._held[layer]).tolist())

    def begin_step(self, step: StepInfo, n_tokens: int, n_context: int) -> None:
        if not self._prepared:
            raise RuntimeError("OffloadEngine.prepare(calibration) must run before the first step")
        if self._step is not None:
            self.end_step()
        self.system.on_step(step)
        self._step = step
        self._rows = 0
        self._landings = {}
        self.ledger.begin_forward(step, n_tokens, n_context)
        if self.trace is not None:
            self.trace.add_step(step, n_tokens, n_context)

    def end_step(self) -> None:
        if self._step is None:
            return
        if self._pending is not None:
            raise RuntimeError(
                f"end_step with layer {self._pending.layer} decided but not accounted: call account(pending) first"
            )
        start = perf_counter()
        self.ledger.end_forward()  # charges a batch of forwards now and then: part of the engine's time
        self._host_engine_s += perf_counter() - start
        self._step = None

    @property
    def in_forward(self) -> bool:
        """Whether a forward is open (begin_step without its end_step yet)."""
        return self._step is not None

    @property
    def counters(self) -> Counters:
        return self.ledger.counters_now()

    @property
    def step_series(self) -> list[dict[str, Any]]:
        return self.ledger.step_series()

    # ---- one MoE layer -----------------------------------------------------------------
    def plan_layer(self, layer: int, load: torch.Tensor | np.ndarray, hint: Hints = None) -> LayerPlan:
        """Decide and account one layer (the replay API): `decide` then `account`."""
        plan, pending = self.decide(layer, load, hint)
        self.account(pending)
        return plan

    def decide(
        self, layer: int, load: torch.Tensor | np.ndarray, hint: Hints = None
    ) -> tuple[LayerPlan, PendingLayer]:
        """The first half of a layer: record the trace, ask the system, check its plan and
        move residency. `load`: the layer's tokens per expert, a torch tensor (the live
        router's) or an int64 numpy vector (a replay's). Returns the plan and what `account`
        needs; call `account(pending)` before deciding another layer (or ending the
        forward). `account` reads the load again (a view of `load` when that already is an
        int64 CPU vector): leave it as it is until then. `hint`: the next layer's predicted
        load of the system's channel (a replay's, a test's), or a mapping channel -> load
        of every channel computed (a live layer's: the trace records them all, the system
        reads its own)."""
        start = perf_counter()
        if self._step is None:
            raise RuntimeError("plan_layer/decide outside begin_step/end_step")
        if self._pending is not None:
            raise RuntimeError(
                f"decide(layer {layer}) while layer {self._pending.layer} is decided but not accounted: "
                "call account(pending) first"
            )
        if type(load) is np.ndarray and load.dtype is _INT64 and load.ndim == 1:
            # a replay hands numpy rows (read-only): no torch at all
            loads = _read_only(load) if load.flags.writeable else load
        else:
            if not (load.is_cpu and load.dtype is torch.long and load.dim() == 1):
                load = load.detach().to("cpu", torch.long).flatten()
            loads = load.numpy()  # what systems and rules read: numpy, a view of the load
            loads.flags.writeable = False  # a system reads the load; the ledger records it after the plan
        system = self.system
        # a bare tensor (or None) is the system's own channel's; a mapping holds every channel computed
        single = hint is None or isinstance(hint, torch.Tensor)
        if self.trace is not None:
            recorded = {system.hint_channel: hint} if single and hint is not None else hint
            self.trace.record(layer, load if type(load) is torch.Tensor else torch.from_numpy(loads.copy()), recorded)
        plan_start = perf_counter()
        mine = None if not system.wants_hint else hint if single else hint.get(system.hint_channel)
        plan = system.plan(layer, loads, mine, self._views[layer])
        plan_s = perf_counter() - plan_start
        # checks read residency as it is before the plan; `_move` then applies the plan
        gpu, missed, moves = self.rules.check(layer, loads, plan, self._held, self._counts)
        moved = moves is not NO_MOVES or plan.evict_elsewhere
        async_targets = self._move(layer, moves, plan.evict_elsewhere) if moved else _NO_COPIES
        self._check_total(layer)
        if plan.free_moves:  # free moves (the oracle's) land before the layer: it misses only what it leaves out
            missed = np.greater(loads, 0) > self._held[layer]
        pending = PendingLayer(layer, plan, loads, gpu, missed, moves.n_scratch, moves.n_cached,
                               async_targets, plan_s)
        self._pending = pending
        pending.engine_s = perf_counter() - start - plan_s
        return plan, pending

    def _check_total(self, layer: int) -> None:
        """Under a global budget, the experts resident over all layers stay within B x layers."""
        if self.total_capacity is not None and self._n_resident > self.total_capacity:
            raise PlanError(self.system.name, layer, "global-capacity",
                            f"{self._n_resident} experts resident over all layers, budget {self.total_capacity}")

    def run_experts(
        self,
        layer: int,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_w: torch.Tensor,
        experts: Sequence[ExpertWeights],
        hint_fn: HintFn | None,
    ) -> torch.Tensor:
        self.route(layer, expert_load(topk_idx, self.n_experts), hint_fn)
        # One call over every routed expert: splitting GPU and CPU experts into two calls
        # would change the summation order and break bit-identity with gpu_only.
        return compute_routed_experts(x, topk_idx, topk_w, experts)

    def route(self, layer: int, load: torch.Tensor, hint_fn: HintFn | None) -> None:
        """A MoE layer's routing from a model whose own code computes the experts (the
        transformers bridge, harness/families/bridge.py): plan, check and charge it. The
        next layer's hints are computed only for the channels the system or the trace wants."""
        self.plan_layer(layer, load, self.live_hints(hint_fn))

    def live_hints(self, hint_fn: HintFn | None) -> dict[str, torch.Tensor] | None:
        """A live layer's hints: `hint_fn` called for each channel in `hint_channels`."""
        if hint_fn is None or not self.hint_channels:
            return None
        return {channel: hint_fn(channel) for channel in self.hint_channels}

    # ---- apply and charge --------------------------------------------------------------
    def _move(self, layer: int, moves: Moves, elsewhere: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Apply a checked plan's moves to residency (this layer's, the next one's for a
        prefetch, other layers' for evictions elsewhere). Returns the async copies issued,
        as (layer, expert)."""
        held, counts = self._held, self._counts
        row = held[layer]
        if moves.n_evict:
            np.greater(row, moves.evict, out=row)
        if moves.n_cached:
            np.logical_or(row, moves.cached, out=row)
        added = moves.n_cached - moves.n_evict
        async_targets: list[tuple[int, int]] = []
        if moves.n_async:
            row[moves.fetch_async] = True
            added += moves.n_async
            async_targets = [(layer, e) for e in moves.fetch_async.tolist()]
        counts[layer] += added
        if len(moves.prefetch) or len(moves.prefetch_evict):
            held[layer + 1, moves.prefetch_evict] = False
            held[layer + 1, moves.prefetch] = True
            counts[layer + 1] += len(moves.prefetch) - len(moves.prefetch_evict)
            added += len(moves.prefetch) - len(moves.prefetch_evict)
            async_targets += [(layer + 1, e) for e in moves.prefetch.tolist()]
        for other, e in elsewhere:  # checked: resident in another layer
            held[other, e] = False
            counts[other] -= 1
            added -= 1
        self._n_resident += added
        return async_targets

    def account(self, pending: PendingLayer) -> None:
        """The second half of a layer: record its outcome in the ledger (counters and the
        forward's timeline are charged from it). Takes the `pending` the last `decide`
        returned, exactly once."""
        start = perf_counter()
        if pending is not self._pending:
            raise RuntimeError(
                "account(pending) takes the layer the last decide() returned, once"
                + (f" (layer {self._pending.layer} is pending)" if self._pending is not None else "")
            )
        self._pending = None
        plan = pending.plan
        free = plan.free_moves
        n_scratch, n_cached = pending.n_scratch, pending.n_cached_sync
        gpu_s = _NAN
        if self._multi:  # the GPUs run their experts concurrently: the slowest one counts
            assert plan.device is not None
            gpu_s = self.topology.layer_time(self.cost, torch.from_numpy(pending.loads.copy()), plan.device)
        self.ledger.record_layer(
            pending.loads, pending.gpu, pending.missed, 0 if free else n_cached, n_scratch, n_cached if free else 0,
            len(pending.async_targets), self._landing_wait(pending), gpu_s,
        )
        self._host_plan_s += pending.plan_s
        self._host_layer_steps += 1
        self._host_engine_s += pending.engine_s + (perf_counter() - start)

    def _landing_wait(self, pending: PendingLayer) -> tuple[int, int]:
        """The async copies this layer's GPU experts wait for, as (row of this forward
        that issued them, how many of its copies must have landed); notes the copies this
        layer issues for the layers after it."""
        row = self._rows
        self._rows += 1
        in_flight = self._landings.pop(pending.layer, None)
        wait = (0, 0)
        if in_flight:
            gpu = pending.gpu
            used = [at for e, at in in_flight.items() if gpu[e]]
            if used:
                if len({r for r, _ in used}) > 1:
                    raise RuntimeError(
                        f"layer {pending.layer}: its GPU experts wait for async copies issued by two layers "
                        "of this forward; layers must be planned once each, in order"
                    )
                wait = max(used)
        for i, (target, e) in enumerate(pending.async_targets):
            self._landings.setdefault(target, {})[e] = (row, i + 1)
        return wait

    def host_seconds(self) -> dict[str, float | int]:
        """Wall-clock host seconds of this process since the engine was made: inside
        `System.plan` (host_plan_s), the engine's own bookkeeping of decide + account
        without the plan (host_engine_s), over host_layer_steps accounted layers. Not in
        `summary()`: summaries are compared exactly across runs, these never repeat."""
        return {
            "host_plan_s": self._host_plan_s,
            "host_engine_s": self._host_engine_s,
            "host_layer_steps": self._host_layer_steps,
        }

    # ---- results -----------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {
            "system": self.system.name,
            "hardware": self.cost.hw.name,
            "n_gpus": self.topology.n_gpus,
            "experts_per_layer": self.experts_per_layer,
            "capacity": self.capacity,
            **({"total_capacity": self.total_capacity} if self.total_capacity is not None else {}),
            **self.ledger.figures(),
        }

    # ---- replay ------------------------------------------------------------------------
    def replay(self, trace: RoutingTrace) -> dict[str, Any]:
        """Run the system over a recorded trace (no weights), layer by layer as a live run
        plans, with the tokens and context `RoutingTrace.forward_size` gives each forward.
        harness/traces/batch_replay.py replays systems that plan in batch faster, to the same bits."""
        loads = trace.loads.to(torch.long).numpy()  # one conversion, not one per layer
        loads.flags.writeable = False  # as live: systems read the loads, never change them
        for s in range(len(trace.steps)):
            self.replay_forward(trace, s, loads[s])
        return self.summary()

    def replay_forward(self, trace: RoutingTrace, s: int, rows: np.ndarray) -> None:
        """Forward s of a recorded trace, layer by layer; `rows`: its int64 loads [L, E], read-only."""
        self.begin_step(trace.steps[s], *trace.forward_size(s, self.geometry.num_experts_per_tok))
        for layer in range(self.n_layers):
            wants = self.system.wants_hint and layer + 1 < self.n_layers
            self.plan_layer(layer, rows[layer], trace.hint(s, layer, self.system.hint_channel) if wants else None)
        self.end_step()
