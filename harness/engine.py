"""The offload engine: residency per MoE layer, plan validation, charging, execution.

A system only answers `plan(layer, load, hint, resident)`; the engine owns residency
(per layer a set of at most B experts on the GPU), checks every plan against the rules
(harness/plan_rules.py), applies it, counts what it implies and charges it with the cost
model's forward timeline (harness/cost.py). It needs no weights: `plan_layer` is the
replay API, and `run_experts` (the live MoE layer's entry) adds the numerics.

One layer is two halves, `plan_layer(layer, load, hint) = decide + account`:

    plan, pending = engine.decide(layer, load, hint)   # System.plan, validation, residency
    ...                                                 # an executor launches the GPU work
    engine.account(pending)                             # counters, cost-model charges

`decide` does everything an executor needs before it runs the layer: it records the
trace, asks the system, checks the plan and moves residency (this layer's and, for a
prefetch, the next one's), so `resident` already holds the layer's outcome when it
returns. `account` adds the layer's counters and charges it on the forward timeline; it
reads nothing `decide` has not fixed, so an executor may run it while the GPU kernels
run. At most one layer is pending: `decide` refuses while one is, and `end_step` refuses
to close a forward with one. Results are the same bits whichever way a layer is driven.

Host time: the engine times (time.perf_counter) the seconds inside `System.plan` and its
own bookkeeping (decide + account without the plan) per layer; `host_seconds()` returns
them. They are wall-clock figures of this process, so they are not in `summary()`
(summaries are compared exactly across runs).

Rules a plan must keep: listed in harness/plan_rules.py, whose `PlanRules.check` raises
`PlanError` (re-exported here) naming system, layer and rule. With topology=multi
(harness/topology.py) every expert stays resident on the GPU its plan names, and the
layer's GPU time is its slowest GPU's.

Counters: a missed pair is a routed token-expert pair whose expert was not resident when
the layer started (for a system with free movement, the oracle, after its free moves);
io_bytes counts every charged host->GPU copy (sync, scratch, async, prefetch).

Speed: the bookkeeping runs once per layer of every forward, so it works on plain Python
ints and sets and numpy views of the load, never indexes a tensor with a list, and sums
expert times with `CostModel.gpu_expert_total` / `cpu_expert_total` (the bits of summing
the cost model's vector functions in torch, without building those tensors).

Lossless: `run_experts` computes every routed expert with one call of
`compute_routed_experts` in canonical order, so on one device every placement gives the
bits of gpu_only; placement changes only what is charged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np
import torch

from harness.cost import CostModel, ForwardTimeline
from harness.model.config import LLaDA2Config
from harness.model.experts import ExpertWeights, HintFn, compute_routed_experts, expert_load
from harness.plan_rules import PlanError, PlanRules
from harness.topology import SINGLE, Topology, check_system_topology
from harness.trace import RoutingTrace
from systems.base import LayerPlan, PrepareContext, StepInfo, System

__all__ = ["OffloadEngine", "PendingLayer", "PlanError"]  # PlanError lives in harness/plan_rules.py

_NO_LOADS = np.zeros(0, np.int64)


@dataclass(eq=False, slots=True)
class PendingLayer:
    """A layer `OffloadEngine.decide` has decided (plan checked, residency moved) and
    `OffloadEngine.account` has still to count and charge. Read-only for callers."""

    layer: int
    plan: LayerPlan
    load: torch.Tensor  # int64 [E] on the CPU: tokens routed to each expert
    gpu: list[int]  # experts computed on the GPU, ascending
    cpu: list[int]  # experts computed on the CPU, ascending
    missing: list[int]  # routed experts not resident when the layer started (free movement: after its moves)
    n_scratch: int
    n_cached_sync: int  # sync fetches that stay resident
    async_targets: list[tuple[int, int]] = field(default_factory=list)  # (layer, expert) copies issued
    plan_s: float = 0.0  # host seconds inside System.plan
    engine_s: float = 0.0  # host seconds of decide's own work
    _loads: np.ndarray | None = None  # numpy view of `load`
    _gpu_index: Any = None  # picks the GPU experts' loads from _loads
    _cpu_index: Any = None
    _scratch: set[int] | frozenset[int] = frozenset()  # plan.scratch as a set


@dataclass
class _Counters:
    routed_pairs: int = 0
    missed_pairs: int = 0
    cpu_expert_tokens: int = 0
    copies_sync: int = 0
    copies_async: int = 0
    copies_scratch: int = 0
    copies_free: int = 0
    time_gpu_experts_s: float = 0.0
    time_cpu_experts_s: float = 0.0
    time_copies_s: float = 0.0
    time_non_expert_s: float = 0.0
    busy_cpu_experts_s: float = 0.0
    busy_copies_s: float = 0.0


class OffloadEngine:
    """Implements the `ExpertEngine` protocol of harness/model/experts.py."""

    def __init__(
        self,
        system: System,
        geometry: LLaDA2Config,
        experts_per_layer: int,
        cost: CostModel,
        trace: RoutingTrace | None = None,
        topology: Topology | None = None,
    ) -> None:
        self.system = system
        # topology=multi: expert parallelism, every expert resident on the GPU its plan.device
        # names, nothing offloaded; a layer is charged as its slowest GPU (harness/topology.py)
        self.topology = topology or SINGLE
        check_system_topology(system.name, system.multi_gpu, self.topology)
        self.geometry = geometry
        self.n_layers = geometry.n_moe_layers
        self.n_experts = geometry.num_experts
        self.experts_per_layer = experts_per_layer
        # gpu_only ignores the budget: it is the all-resident reference, not an offloader.
        self.capacity = self.n_experts if system.ignores_budget else experts_per_layer
        self.rules = PlanRules(system.name, self.n_experts, self.n_layers, self.capacity, self.topology)
        self.free_movement = system.free_movement
        self.cost = cost
        self.trace = trace
        # a recorded trace carries next-layer hints so that replays of hint-using systems
        # (prefetching) see what they would have seen live
        self.record_hints = trace is not None
        self.resident: list[set[int]] = []
        self.counters = _Counters()
        self.step_series: list[dict[str, Any]] = []
        self._timeline: ForwardTimeline | None = None
        self._step: StepInfo | None = None
        self._step_routed = self._step_missed = 0
        self._prepared = False
        self._pending: PendingLayer | None = None  # decided, not yet accounted
        self._host_plan_s = self._host_engine_s = 0.0
        self._host_layer_steps = 0

    # ---- lifecycle ---------------------------------------------------------------------
    def prepare(self, calibration: RoutingTrace | None, decode_steps: int | None = None) -> None:
        ctx = PrepareContext(
            self.geometry, self.experts_per_layer, self.cost, calibration, decode_steps, topology=self.topology
        )
        self.system.prepare(ctx)
        initial = self.system.initial_residency(self.n_layers, self.n_experts, self.capacity)
        self.rules.check_initial(initial)
        self.resident = [set(experts) for experts in initial]
        self._prepared = True

    def begin_step(self, step: StepInfo, n_tokens: int, n_context: int) -> None:
        if not self._prepared:
            raise RuntimeError("OffloadEngine.prepare(calibration) must run before the first step")
        if self._timeline is not None:
            self.end_step()
        self.system.on_step(step)
        self._step = step
        self._timeline = ForwardTimeline(self.cost, n_tokens, n_context)
        self.counters.time_non_expert_s += self._timeline.parts.total
        self._step_routed = self._step_missed = 0
        if self.trace is not None:
            self.trace.add_step(step, n_tokens, n_context)

    def end_step(self) -> None:
        if self._timeline is None or self._step is None:
            return
        if self._pending is not None:
            raise RuntimeError(
                f"end_step with layer {self._pending.layer} decided but not accounted: call account(pending) first"
            )
        total = self._timeline.finish()
        self.counters.time_copies_s += self._timeline.drain_s
        step = self._step
        self.step_series.append(
            {
                "global_step": step.global_step,
                "prompt": step.prompt,
                "kind": step.kind,
                "block": step.block,
                "step": step.step,
                "routed_pairs": self._step_routed,
                "missed_pairs": self._step_missed,
                "miss_rate": self._step_missed / self._step_routed if self._step_routed else 0.0,
                "modeled_latency_s": total,
            }
        )
        self._timeline = None
        self._step = None

    # ---- one MoE layer -----------------------------------------------------------------
    def plan_layer(self, layer: int, load: torch.Tensor, hint: torch.Tensor | None = None) -> LayerPlan:
        """Decide and account one layer (the replay API): `decide` then `account`."""
        plan, pending = self.decide(layer, load, hint)
        self.account(pending)
        return plan

    def decide(
        self, layer: int, load: torch.Tensor, hint: torch.Tensor | None = None
    ) -> tuple[LayerPlan, PendingLayer]:
        """The first half of a layer: record the trace, ask the system, check its plan and
        move residency. Returns the plan and what `account` needs; call `account(pending)`
        before deciding another layer (or ending the forward). `account` reads the load
        again (a view of `load` when that already is an int64 CPU vector): leave it as it
        is until then."""
        start = perf_counter()
        if self._timeline is None:
            raise RuntimeError("plan_layer/decide outside begin_step/end_step")
        if self._pending is not None:
            raise RuntimeError(
                f"decide(layer {layer}) while layer {self._pending.layer} is decided but not accounted: "
                "call account(pending) first"
            )
        load = load.detach().to("cpu", torch.long).flatten()
        if self.trace is not None:
            self.trace.record(layer, load, hint)
        resident = self.resident[layer]
        system = self.system
        held = frozenset(resident)
        plan_start = perf_counter()
        plan = system.plan(layer, load, hint if system.wants_hint else None, held)
        plan_s = perf_counter() - plan_start
        # checks read residency as it is before the plan; `_move` then applies the plan
        gpu, cpu, missing, scratch, loads, gpu_index, cpu_index = self.rules.check(layer, load, plan, self.resident)
        pending = PendingLayer(
            layer, plan, load, gpu, cpu, missing, len(scratch), 0,
            _loads=loads, _gpu_index=gpu_index, _cpu_index=cpu_index, _scratch=scratch,
        )
        self._move(pending, resident)
        pending.plan_s = plan_s
        self._pending = pending
        pending.engine_s = perf_counter() - start - plan_s
        return plan, pending

    def run_experts(
        self,
        layer: int,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_w: torch.Tensor,
        experts: Sequence[ExpertWeights],
        hint_fn: HintFn | None,
    ) -> torch.Tensor:
        load = expert_load(topk_idx, self.n_experts)
        wants = self.system.wants_hint or self.record_hints
        hint = hint_fn() if (hint_fn is not None and wants) else None
        self.plan_layer(layer, load, hint)
        # One call over every routed expert: splitting GPU and CPU experts into two calls
        # would change the summation order and break bit-identity with gpu_only.
        return compute_routed_experts(x, topk_idx, topk_w, experts)

    # ---- apply and charge --------------------------------------------------------------
    def _move(self, pending: PendingLayer, resident: set[int]) -> None:
        """Apply a checked plan's moves to residency (this layer's and, for a prefetch,
        the next one's) and note the misses: routed experts not resident when the layer
        started (with free movement: not resident after the plan's moves)."""
        plan, layer = pending.plan, pending.layer
        fetch_sync = plan.fetch_sync
        if pending.n_scratch:
            scratch = pending._scratch
            cached_sync = [e for e in fetch_sync if e not in scratch]
        else:
            cached_sync = list(fetch_sync)
        free = self.free_movement
        if not free:  # GPU misses were found by the check; the CPU's are the non-resident ones
            cpu_missing = [e for e in pending.cpu if e not in resident]
            if cpu_missing:
                pending.missing = pending.missing + cpu_missing
        if plan.evict:
            resident.difference_update(plan.evict)
        resident.update(cached_sync)
        resident.update(plan.fetch_async)
        if free:  # the oracle's moves land before the layer: it misses only what it leaves out
            pending.missing = [e for e in pending.gpu if e not in resident] + [
                e for e in pending.cpu if e not in resident
            ]
        async_targets = [(layer, e) for e in plan.fetch_async]
        if plan.prefetch or plan.prefetch_evict:
            nxt = self.resident[layer + 1]
            nxt.difference_update(plan.prefetch_evict)
            nxt.update(plan.prefetch)
            async_targets += [(layer + 1, e) for e in plan.prefetch]
        pending.async_targets = async_targets
        pending.n_cached_sync = len(cached_sync)

    def account(self, pending: PendingLayer) -> None:
        """The second half of a layer: add its counters and charge it on the forward's
        timeline. Takes the `pending` the last `decide` returned, exactly once."""
        start = perf_counter()
        if pending is not self._pending:
            raise RuntimeError(
                "account(pending) takes the layer the last decide() returned, once"
                + (f" (layer {self._pending.layer} is pending)" if self._pending is not None else "")
            )
        self._pending = None
        c, plan, loads = self.counters, pending.plan, pending._loads
        assert loads is not None and self._timeline is not None
        free = self.free_movement
        pairs = int(loads.sum())  # only routed experts have tokens
        missed = int(loads[pending.missing].sum()) if pending.missing else 0
        cpu_loads = loads[pending._cpu_index] if pending.cpu else _NO_LOADS
        n_scratch, n_cached = pending.n_scratch, pending.n_cached_sync
        async_targets = pending.async_targets
        n_sync = n_scratch if free else len(plan.fetch_sync)
        c.routed_pairs += pairs
        c.missed_pairs += missed
        self._step_routed += pairs
        self._step_missed += missed
        c.cpu_expert_tokens += int(cpu_loads.sum()) if pending.cpu else 0
        c.copies_scratch += n_scratch
        c.copies_sync += 0 if free else n_cached
        c.copies_free += n_cached if free else 0
        c.copies_async += len(async_targets)
        if self.topology.multi:  # the GPUs run their experts concurrently: the slowest one counts
            assert plan.device is not None
            gpu_s = self.topology.layer_time(self.cost, pending.load, plan.device)
        else:
            gpu_s = self.cost.gpu_expert_total(loads[pending._gpu_index]) if pending.gpu else 0.0
        cpu_s = self.cost.cpu_expert_total(cpu_loads)
        timing = self._timeline.charge_layer(
            pending.layer, gpu_s, cpu_s, n_sync, pending.gpu, async_targets, self.system.overlap
        )
        c.time_gpu_experts_s += timing.gpu_s
        c.time_cpu_experts_s += timing.cpu_s
        c.time_copies_s += timing.copies_s
        c.busy_cpu_experts_s += cpu_s
        c.busy_copies_s += self.cost.copy_time(n_sync + len(async_targets))
        self._host_plan_s += pending.plan_s
        self._host_layer_steps += 1
        self._host_engine_s += pending.engine_s + (perf_counter() - start)

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
    def layer_resident(self, layer: int) -> frozenset[int]:
        return frozenset(self.resident[layer])

    def summary(self) -> dict[str, Any]:
        c = self.counters
        copies = c.copies_sync + c.copies_async + c.copies_scratch
        io_bytes = int(copies * self.cost.expert_bytes)
        modeled = c.time_gpu_experts_s + c.time_cpu_experts_s + c.time_copies_s + c.time_non_expert_s
        return {
            "system": self.system.name,
            "hardware": self.cost.hw.name,
            "n_gpus": self.topology.n_gpus,
            "experts_per_layer": self.experts_per_layer,
            "capacity": self.capacity,
            "forwards": len(self.step_series),
            "routed_pairs": c.routed_pairs,
            "missed_pairs": c.missed_pairs,
            "miss_rate": c.missed_pairs / c.routed_pairs if c.routed_pairs else 0.0,
            "io_bytes": io_bytes,
            "io_gb": io_bytes / 1e9,
            "cpu_expert_tokens": c.cpu_expert_tokens,
            "copies_sync": c.copies_sync,
            "copies_async": c.copies_async,
            "copies_scratch": c.copies_scratch,
            "copies_free": c.copies_free,
            "time_gpu_experts_s": c.time_gpu_experts_s,
            "time_cpu_experts_s": c.time_cpu_experts_s,
            "time_copies_s": c.time_copies_s,
            "time_non_expert_s": c.time_non_expert_s,
            "busy_cpu_experts_s": c.busy_cpu_experts_s,
            "busy_copies_s": c.busy_copies_s,
            "modeled_time_s": modeled,
            "step_series": list(self.step_series),
        }

    # ---- replay ------------------------------------------------------------------------
    def replay(self, trace: RoutingTrace) -> dict[str, Any]:
        """Run the system over a recorded trace (no weights), with the tokens and context
        the trace recorded per forward; where it recorded none (0), tokens come from the
        loads (every token routes to top_k experts) and the context equals them."""
        loads = trace.loads
        top_k = self.geometry.num_experts_per_tok
        for s, step in enumerate(trace.steps):
            from_loads = -(-int(loads[s].sum(-1).max()) // top_k) if loads.shape[1] else 0
            n_tokens = trace.n_tokens[s] or from_loads
            self.begin_step(step, n_tokens, trace.n_context[s] or n_tokens)
            rows = loads[s].to(torch.long).unbind(0)  # one conversion per forward, not per layer
            for layer in range(self.n_layers):
                wants = self.system.wants_hint and layer + 1 < self.n_layers
                self.plan_layer(layer, rows[layer], trace.hint(s, layer) if wants else None)
            self.end_step()
        return self.summary()
