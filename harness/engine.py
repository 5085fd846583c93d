"""The offload engine: residency per MoE layer, plan validation, charging, execution.

A system only answers `plan(layer, load, hint, resident)`; the engine owns residency
(per layer a set of at most B experts on the GPU), checks every plan against the rules
below, applies it, counts what it implies and charges it with the cost model's forward
timeline (harness/cost.py). It needs no weights: `plan_layer` is the replay API, and
`run_experts` (the live MoE layer's entry) adds the numerics.

Rules a plan must keep (a violation raises `PlanError` naming system, layer and rule):
every routed expert (load > 0) is computed exactly once, on the GPU or on the CPU, and
nothing unrouted is computed; an expert computed on the GPU is resident or fetched sync
by this plan; an evicted expert is resident and not computed on the GPU in this plan; a
fetched expert is not already resident; scratch copies are sync fetches used once on the
GPU and never cached; capacity: resident - evicted + cached sync fetches + async fetches
<= B (scratch copies do not count). A plan may also fetch asynchronously into
layer l+1's cache (evicting from it), under the same capacity rule for layer l+1.

With topology=multi (expert parallelism, harness/topology.py) every expert is resident
on one of several GPUs: a plan also names each expert's GPU (`plan.device`), computes
nothing on the CPU and moves nothing, and the layer's GPU time is its slowest GPU's.

Counters: a missed pair is a routed token-expert pair whose expert was not resident when
the layer started (for a system with free movement, the oracle, after its free moves);
io_bytes counts every charged host->GPU copy (sync, scratch, async, prefetch).

Lossless: `run_experts` computes every routed expert with one call of
`compute_routed_experts` in canonical order, so on one device every placement gives the
bits of gpu_only; placement changes only what is charged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.cost import CostModel, ForwardTimeline
from harness.model.config import LLaDA2Config
from harness.model.experts import ExpertWeights, HintFn, compute_routed_experts, expert_load
from harness.topology import SINGLE, Topology, check_system_topology
from harness.trace import RoutingTrace
from systems.base import LayerPlan, PrepareContext, StepInfo, System

INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class PlanError(AssertionError):
    def __init__(self, system: str, layer: int, rule: str, detail: str) -> None:
        super().__init__(f"system {system!r}, layer {layer}: plan breaks rule '{rule}': {detail}")
        self.system, self.layer, self.rule = system, layer, rule


def _ids(mask: torch.Tensor) -> set[int]:
    return set(torch.nonzero(mask).flatten().tolist())


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

    # ---- lifecycle ---------------------------------------------------------------------
    def prepare(self, calibration: RoutingTrace | None, decode_steps: int | None = None) -> None:
        ctx = PrepareContext(
            self.geometry, self.experts_per_layer, self.cost, calibration, decode_steps, topology=self.topology
        )
        self.system.prepare(ctx)
        initial = self.system.initial_residency(self.n_layers, self.n_experts, self.capacity)
        if len(initial) != self.n_layers:
            raise PlanError(
                self.system.name, -1, "initial-residency", f"{len(initial)} layers, expected {self.n_layers}"
            )
        for layer, experts in enumerate(initial):
            bad = [e for e in experts if not 0 <= e < self.n_experts]
            if bad or len(experts) > self.capacity:
                raise PlanError(
                    self.system.name,
                    layer,
                    "initial-residency",
                    f"{len(experts)} experts (capacity {self.capacity}), bad ids {bad}",
                )
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
        if self._timeline is None:
            raise RuntimeError("plan_layer outside begin_step/end_step")
        load = load.detach().to("cpu", torch.long).flatten()
        if self.trace is not None:
            self.trace.record(layer, load, hint)
        resident = self.resident[layer]
        plan = self.system.plan(layer, load, hint if self.system.wants_hint else None, frozenset(resident))
        routed, gpu, cpu = self._check(layer, load, plan, resident)
        self._apply(layer, load, plan, resident, routed, gpu, cpu)
        return plan

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

    # ---- validation --------------------------------------------------------------------
    def _fail(self, layer: int, rule: str, detail: str) -> None:
        raise PlanError(self.system.name, layer, rule, detail)

    def _check_list(self, layer: int, name: str, items: list[int]) -> set[int]:
        bad = [e for e in items if not (isinstance(e, int) and 0 <= e < self.n_experts)]
        if bad:
            self._fail(layer, "bad-id", f"{name} holds {bad[:5]}")
        if len(set(items)) != len(items):
            self._fail(layer, "duplicate", f"{name} lists an expert twice")
        return set(items)

    def _check(
        self, layer: int, load: torch.Tensor, plan: LayerPlan, resident: set[int]
    ) -> tuple[set[int], set[int], set[int]]:
        E = self.n_experts
        for name in ("gpu", "cpu"):
            mask = getattr(plan, name)
            if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.shape == (E,)):
                self._fail(layer, "shape", f"plan.{name} must be a bool tensor [{E}]")
        routed, gpu, cpu = _ids(load > 0), _ids(plan.gpu), _ids(plan.cpu)
        sync = self._check_list(layer, "fetch_sync", plan.fetch_sync)
        asyn = self._check_list(layer, "fetch_async", plan.fetch_async)
        scratch = self._check_list(layer, "scratch", plan.scratch)
        evict = self._check_list(layer, "evict", plan.evict)
        if gpu & cpu:
            self._fail(layer, "computed-twice", f"experts {sorted(gpu & cpu)[:5]} on both GPU and CPU")
        if routed - gpu - cpu:
            self._fail(layer, "routed-not-computed", f"routed experts {sorted(routed - gpu - cpu)[:5]}")
        if (gpu | cpu) - routed:
            self._fail(
                layer, "unrouted-computed", f"experts {sorted((gpu | cpu) - routed)[:5]} have no tokens"
            )
        if evict - resident:
            self._fail(layer, "evict-not-resident", f"experts {sorted(evict - resident)[:5]}")
        if (sync | asyn) & resident or sync & asyn:
            self._fail(
                layer,
                "fetch-resident",
                f"experts {sorted(((sync | asyn) & resident) | (sync & asyn))[:5]}"
                " are already resident or fetched twice",
            )
        if scratch - sync:
            self._fail(
                layer, "scratch-not-sync", f"scratch experts {sorted(scratch - sync)[:5]} not in fetch_sync"
            )
        if scratch - gpu:
            self._fail(
                layer, "scratch-not-gpu", f"scratch experts {sorted(scratch - gpu)[:5]} not computed on GPU"
            )
        if evict & gpu:
            self._fail(layer, "evicted-computed-on-gpu", f"experts {sorted(evict & gpu)[:5]}")
        if gpu - (resident | sync):
            self._fail(
                layer,
                "gpu-not-resident",
                f"experts {sorted(gpu - (resident | sync))[:5]} neither resident nor fetched sync",
            )
        kept = len(resident - evict) + len(sync - scratch) + len(asyn)
        if kept > self.capacity:
            self._fail(layer, "capacity", f"{kept} experts resident after the plan, capacity {self.capacity}")
        if plan.prefetch or plan.prefetch_evict:
            self._check_prefetch(layer, plan)
        if self.topology.multi:
            self._check_devices(layer, plan, cpu)
        return routed, gpu, cpu

    def _check_devices(self, layer: int, plan: LayerPlan, cpu: set[int]) -> None:
        """Expert parallelism: every expert on one of the GPUs, nothing offloaded."""
        device, E, G = plan.device, self.n_experts, self.topology.n_gpus
        if not (isinstance(device, torch.Tensor) and device.shape == (E,)) or device.dtype not in INT_DTYPES:
            self._fail(layer, "device", f"topology=multi needs plan.device, an int tensor [{E}]")
        if int(device.min()) < 0 or int(device.max()) >= G:
            self._fail(layer, "device", f"plan.device names GPUs outside 0..{G - 1}")
        if cpu or plan.fetch_sync or plan.fetch_async or plan.evict or plan.prefetch or plan.prefetch_evict:
            self._fail(layer, "multi-gpu-offload", "topology=multi keeps every expert resident: no CPU, no moves")

    def _check_prefetch(self, layer: int, plan: LayerPlan) -> None:
        if layer + 1 >= self.n_layers:
            self._fail(layer, "prefetch-last-layer", "the last MoE layer has no next layer to prefetch into")
        nxt = self.resident[layer + 1]
        fetch = self._check_list(layer, "prefetch", plan.prefetch)
        evict = self._check_list(layer, "prefetch_evict", plan.prefetch_evict)
        if evict - nxt:
            self._fail(
                layer, "prefetch-evict-not-resident", f"layer {layer + 1} experts {sorted(evict - nxt)[:5]}"
            )
        if fetch & nxt:
            self._fail(layer, "prefetch-resident", f"layer {layer + 1} experts {sorted(fetch & nxt)[:5]}")
        if len(nxt - evict) + len(fetch) > self.capacity:
            self._fail(
                layer, "prefetch-capacity", f"layer {layer + 1} would hold {len(nxt - evict) + len(fetch)}"
            )

    # ---- apply and charge --------------------------------------------------------------
    def _apply(
        self,
        layer: int,
        load: torch.Tensor,
        plan: LayerPlan,
        resident: set[int],
        routed: set[int],
        gpu: set[int],
        cpu: set[int],
    ) -> None:
        c = self.counters
        scratch = set(plan.scratch)
        cached_sync = [e for e in plan.fetch_sync if e not in scratch]
        free = self.free_movement
        missing = routed - resident  # not resident when the layer started
        resident.difference_update(plan.evict)
        resident.update(cached_sync)
        resident.update(plan.fetch_async)
        if free:  # the oracle's moves land before the layer: it misses only what it leaves out
            missing = routed - resident
        pairs = int(load.sum())  # only routed experts have tokens
        missed = int(load[sorted(missing)].sum())
        async_targets = [(layer, e) for e in plan.fetch_async]
        if plan.prefetch or plan.prefetch_evict:
            nxt = self.resident[layer + 1]
            nxt.difference_update(plan.prefetch_evict)
            nxt.update(plan.prefetch)
            async_targets += [(layer + 1, e) for e in plan.prefetch]
        n_sync = len(scratch) if free else len(plan.fetch_sync)
        c.routed_pairs += pairs
        c.missed_pairs += missed
        self._step_routed += pairs
        self._step_missed += missed
        c.cpu_expert_tokens += int(load[sorted(cpu)].sum())
        c.copies_scratch += len(scratch)
        c.copies_sync += 0 if free else len(cached_sync)
        c.copies_free += len(cached_sync) if free else 0
        c.copies_async += len(async_targets)
        gpu_ids, cpu_ids = sorted(gpu), sorted(cpu)
        if self.topology.multi:  # the GPUs run their experts concurrently: the slowest one counts
            assert plan.device is not None
            gpu_s = self.topology.layer_time(self.cost, load, plan.device)
        else:
            gpu_s = float(self.cost.gpu_expert_times(load[gpu_ids]).sum())
        cpu_s = float(self.cost.cpu_expert_times(load[cpu_ids]).sum())
        assert self._timeline is not None
        timing = self._timeline.charge_layer(
            layer, gpu_s, cpu_s, n_sync, gpu_ids, async_targets, self.system.overlap
        )
        c.time_gpu_experts_s += timing.gpu_s
        c.time_cpu_experts_s += timing.cpu_s
        c.time_copies_s += timing.copies_s
        c.busy_cpu_experts_s += cpu_s
        c.busy_copies_s += self.cost.copy_time(n_sync + len(async_targets))

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
            for layer in range(self.n_layers):
                wants = self.system.wants_hint and layer + 1 < self.n_layers
                self.plan_layer(layer, loads[s, layer], trace.hint(s, layer) if wants else None)
            self.end_step()
        return self.summary()
