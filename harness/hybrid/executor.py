"""Hybrid execution of one system's plans: resident experts on the device, missed experts
on the CPU, weights moving on a copy stream (docs/gpu.md, docs/cost-model.md).

The executor implements the `ExpertEngine` protocol around an `OffloadEngine`: per MoE
layer the engine decides (`decide`: the system's plan, validated, residency updated) and
the executor carries the plan out; the engine's accounting (`account`: counters, the
modeled time) runs once the GPU work is queued, so it overlaps the device instead of
delaying it:

1. moves, in this order: evictions free slots (recording when their last reader ran);
   sync fetches are queued on the copy stream (into a slot, or a one-use buffer for
   scratch copies); async fetches and prefetches into the next layer follow them on the
   same stream (one PCIe link, FIFO, as the cost model charges it);
2. CPU experts start in a worker thread on host copies of the layer's input (before the
   GPU work is launched when the system overlaps, after the compute stream drained when
   it does not: measured time follows the system's own execution model);
3. GPU experts: the compute stream waits for the copy events of exactly the experts it
   is about to use (sync fetches, scratch copies, earlier async fetches and prefetches
   not yet waited on), then computes them into rows of a [T*K, H] buffer;
4. join: the CPU rows are copied into the same buffer; `combine` sums each token's rows
   in the MoE layer's fixed order once.

Every routed (token, expert) row is computed exactly once, by the side the plan named,
with the expert's full token set, so on one device (the CPU stand-in) the layer output is
bit-identical to gpu_only. On CUDA the CPU rows come from CPU kernels and the GPU rows
from GPU kernels, which round differently; the run reports token match rate instead.

Timing: wall clock (perf_counter) from one step's `begin_step` to the next, the device
synchronized at the step's end; compute-stream events around each step's GPU work and
around each layer's GPU experts; CPU expert seconds measured in the worker. Each step's
figures are added to the engine's step series beside the modeled latency.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.common.errors import HarnessError
from harness.engine.engine import OffloadEngine
from harness.hybrid.attach import DevicePlacement, HostExperts, placement_of
from harness.hybrid.device import Event
from harness.hybrid.pool import SlotPool, fetch_scratch
from harness.model.experts import (
    ExpertGroups,
    ExpertWeights,
    HintFn,
    combine,
    expert_load,
    group_by_expert,
    row_dtype,
    weighted_expert_outputs,
)
from harness.model.llada2 import LLaDA2Model
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo

Scratch = dict[int, tuple[ExpertWeights, Event]]


@dataclass
class _StepClock:
    wall0: float
    gpu0: Event
    expert_marks: list[tuple[Event, Event]] = field(default_factory=list)
    cpu_s: float = 0.0


@dataclass
class StepTiming:
    wall_s: float
    gpu_span_s: float  # compute-stream time from the step's start to its end
    gpu_experts_s: float  # sum over layers of the GPU experts' time
    cpu_experts_s: float  # sum over layers of the CPU worker's time


def _ids(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask).flatten().tolist()


class HybridExecutor:
    """Carries out an `OffloadEngine`'s plans on a device (see the module docstring)."""

    def __init__(self, engine: OffloadEngine, placement: DevicePlacement) -> None:
        if engine.topology.multi:
            raise HarnessError("backend=cuda executes on one GPU; topology=multi (expert parallelism) is modeled "
                               "only: run it with backend=cpu")
        if not engine.resident:
            raise RuntimeError("OffloadEngine.prepare() must run before the executor takes its residency")
        if len(placement.host) != engine.n_layers or len(placement.host[0].views) != engine.n_experts:
            raise RuntimeError(
                f"the model has {len(placement.host)} MoE layers of {len(placement.host[0].views)} experts, "
                f"the engine plans {engine.n_layers} of {engine.n_experts}"
            )
        if engine.total_capacity is not None:  # its slot pools are sized per layer
            raise HarnessError("budget.scope=global runs with backend=cpu only (the CUDA slot pools hold B experts "
                               "per layer); use budget.scope=per_layer on a GPU")
        self.engine, self.placement, self.runtime = engine, placement, placement.runtime
        self.overlap = engine.system.overlap
        self.runtime.reset_peak()  # the peak of this run: non-expert weights, pools, activations
        self._check_pools_fit(engine.capacity, placement)
        self.pools = [SlotPool(self.runtime, layer, engine.capacity, host.views[0])
                      for layer, host in enumerate(placement.host)]
        self.pool_bytes = sum(p.nbytes for p in self.pools)
        self.slots_high_water = 0
        self._load_initial()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-experts")
        self.steps: list[StepTiming] = []
        self._clock: _StepClock | None = None

    def _load_initial(self) -> None:
        """What the system placed before the first forward; not part of any step's time."""
        for layer, pool in enumerate(self.pools):
            host = self.placement.host[layer]
            for e in sorted(self.engine.layer_resident(layer)):
                pool.load(e, host.views[e], "initial")
        self._settle()

    def _check_pools_fit(self, capacity: int, placement: DevicePlacement) -> None:
        """A budget the device cannot hold is a one-line error, not an out-of-memory trace."""
        memory = self.runtime.device_memory()
        if memory is None:
            return
        slot = sum(w.numel() * w.element_size() for w in placement.host[0].views[0])
        need = capacity * len(placement.host) * slot
        if need > memory[0]:
            raise HarnessError(
                f"{capacity} experts per layer x {len(placement.host)} layers need {need / 1e9:.1f} GB of expert "
                f"slots on the GPU, but {memory[0] / 1e9:.1f} GB are free after the non-expert weights; "
                "choose a smaller budget"
            )

    def _settle(self) -> None:
        self.runtime.synchronize()
        for pool in self.pools:
            pool.settled()

    # ---- steps (the decoding loop's hook calls these, as it calls the engine's) ---------
    def begin_step(self, step: StepInfo, n_tokens: int, n_context: int) -> None:
        self.end_step()
        self.engine.begin_step(step, n_tokens, n_context)
        self._clock = _StepClock(time.perf_counter(), self.runtime.mark())

    def end_step(self) -> None:
        clock, self._clock = self._clock, None
        if clock is None:
            return
        gpu1 = self.runtime.mark()
        self._settle()
        rt = self.runtime
        timing = StepTiming(
            wall_s=time.perf_counter() - clock.wall0,
            gpu_span_s=rt.elapsed(clock.gpu0, gpu1),
            gpu_experts_s=sum(rt.elapsed(a, b) for a, b in clock.expert_marks),
            cpu_experts_s=clock.cpu_s,
        )
        self.steps.append(timing)
        opened = self.engine.in_forward
        self.engine.end_step()
        if opened:  # the measured figures beside the modeled ones
            self.engine.ledger.note_last_forward(
                measured_s=timing.wall_s, measured_gpu_span_s=timing.gpu_span_s,
                measured_gpu_experts_s=timing.gpu_experts_s, measured_cpu_experts_s=timing.cpu_experts_s,
            )

    def close(self) -> None:
        """End the last step and free the device slots and the worker."""
        self.end_step()
        self._worker.shutdown(wait=True)
        self.slots_high_water = self._high_water()
        self.pools = []

    def _high_water(self) -> int:
        return max([self.slots_high_water] + [p.high_water for p in self.pools])

    # ---- one MoE layer -------------------------------------------------------------------
    def run_experts(
        self,
        layer: int,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_w: torch.Tensor,
        experts: Sequence[ExpertWeights],
        hint_fn: HintFn | None,
    ) -> torch.Tensor:
        rt, engine = self.runtime, self.engine
        idx, w = topk_idx, topk_w  # summed in the order the MoE layer gave, as compute_routed_experts
        # the layer's one wait for the device: the plan needs the routing on the host; the
        # grouping of rows by expert is then computed there too, so that launching the GPU
        # experts never waits for a `.tolist()` on the device
        idx_host = idx.to(rt.host)
        load = expert_load(idx_host, engine.n_experts)
        groups = group_by_expert(idx_host)
        hints = engine.live_hints(hint_fn)
        if hints is not None:
            hints = {channel: h.to(rt.host) for channel, h in hints.items()}
        plan, pending = engine.decide(layer, load, hints)  # the system's plan, checked; residency moved
        rt.note("plan", layer)
        scratch = self._apply_moves(layer, plan)
        buffer = x.new_zeros(idx.numel(), x.shape[1], dtype=row_dtype(x, w))  # fp32 rows for bf16, as the reference
        cpu_mask = torch.from_numpy(plan.cpu)
        cpu_job = None
        if self.overlap and bool(cpu_mask.any()):
            cpu_job = self._start_cpu(layer, x, idx_host, w, cpu_mask, groups)
        device_groups = groups._replace(order=rt.to_device(groups.order))
        self._run_gpu(layer, x, idx, w, torch.from_numpy(plan.gpu), scratch, buffer, device_groups)
        del scratch  # one-use buffers: never resident, freed once the queued kernels ran
        # the harness's own bookkeeping (counters, modeled time) runs while the device computes
        engine.account(pending)
        if bool(cpu_mask.any()):
            if cpu_job is None:  # no overlap: the CPU starts when the GPU has finished
                rt.wait_compute(layer)
                cpu_job = self._start_cpu(layer, x, idx_host, w, cpu_mask, groups)
            self._join_cpu(layer, cpu_job, idx_host, cpu_mask, buffer)
        self._check_residency(layer, plan)
        rt.note("combine", layer)
        return combine(buffer, x.shape[0], idx.shape[1])

    def _apply_moves(self, layer: int, plan: LayerPlan) -> Scratch:
        pool, host = self.pools[layer], self.placement.host[layer]
        plan = plan.with_lists()  # ids as Python ints: the pools key their slots by them
        for e in plan.evict:  # first: the fetches below need the slots
            pool.evict(e)
        for other, e in plan.evict_elsewhere:  # slot pools are per layer: this frees one there
            self.pools[other].evict(e)
        one_use = set(plan.scratch)
        scratch: Scratch = {}
        for e in plan.fetch_sync:  # first on the copy stream: this layer waits for them
            if e in one_use:
                scratch[e] = fetch_scratch(self.runtime, layer, e, host.views[e])
            else:
                pool.load(e, host.views[e], "sync")
        for e in plan.fetch_async:
            pool.load(e, host.views[e], "async")
        if plan.prefetch or plan.prefetch_evict:
            nxt: HostExperts = self.placement.host[layer + 1]
            for e in plan.prefetch_evict:
                self.pools[layer + 1].evict(e)
            for e in plan.prefetch:
                self.pools[layer + 1].load(e, nxt.views[e], "prefetch")
        return scratch

    def _run_gpu(self, layer: int, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, mask: torch.Tensor,
                 scratch: Scratch, buffer: torch.Tensor, groups: ExpertGroups) -> None:
        ids = _ids(mask)
        if not ids:
            return
        views: list[Any] = [None] * self.engine.n_experts  # only the GPU experts are looked up
        for e in ids:
            if e in scratch:
                weights, landed = scratch[e]
                self.runtime.wait(landed, layer)
                views[e] = weights
            else:
                views[e] = self.pools[layer].weights(e)  # waits for its copy if still pending
        self.runtime.note("gpu", layer, tuple(ids))
        start = self.runtime.mark()
        weighted_expert_outputs(x, idx, w, views, only=mask, buffer=buffer, groups=groups)
        if self._clock is not None:
            self._clock.expert_marks.append((start, self.runtime.mark()))

    def _start_cpu(self, layer: int, x: torch.Tensor, idx_host: torch.Tensor, w: torch.Tensor,
                   mask: torch.Tensor, groups: ExpertGroups) -> Future[tuple[torch.Tensor, float]]:
        host = self.runtime.host
        x_host, w_host = x.to(host), w.to(host)
        self.runtime.note("cpu_start", layer, tuple(_ids(mask)))
        return self._worker.submit(self._cpu_experts, layer, x_host, idx_host, w_host, mask, groups)

    def _cpu_experts(self, layer: int, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor,
                     mask: torch.Tensor, groups: ExpertGroups) -> tuple[torch.Tensor, float]:
        """In the worker thread: torch CPU ops on the host copies of the experts."""
        with torch.inference_mode():  # thread-local: the model's forward set it in its own thread
            start = time.perf_counter()
            rows = weighted_expert_outputs(x, idx, w, self.placement.host[layer].views, only=mask, groups=groups)
            seconds = time.perf_counter() - start
        self.runtime.note("cpu_done", layer)
        return rows, seconds

    def _join_cpu(self, layer: int, job: Future[tuple[torch.Tensor, float]], idx_host: torch.Tensor,
                  mask: torch.Tensor, buffer: torch.Tensor) -> None:
        rows_host, seconds = job.result()
        self.runtime.note("join", layer)
        rows = torch.nonzero(mask[idx_host.reshape(-1)]).flatten()  # on the host: no device wait
        to_device = self.runtime.to_device
        buffer[to_device(rows)] = to_device(rows_host[rows])
        if self._clock is not None:
            self._clock.cpu_s += seconds

    def _check_residency(self, layer: int, plan: LayerPlan) -> None:
        """The slots hold exactly what the engine counts as resident (and never more than B)."""
        layers = [layer, layer + 1] if (len(plan.prefetch) or len(plan.prefetch_evict)) else [layer]
        for lay in layers:
            if self.pools[lay].holds() != self.engine.layer_resident(lay):
                raise RuntimeError(
                    f"layer {lay}: device slots hold {sorted(self.pools[lay].holds())[:8]}..., "
                    f"the engine counts {sorted(self.engine.layer_resident(lay))[:8]}..."
                )

    # ---- results -------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Measured figures for result.json (numbers only: they become metrics)."""
        total = sum(s.wall_s for s in self.steps)
        peak = self.runtime.peak_bytes()
        host = self.engine.host_seconds()
        return {
            # host seconds of the system's planning and of the harness's own bookkeeping
            # inside the measured time: what the harness adds to a real deployment's step
            "measured_host_plan_s": host["host_plan_s"],
            "measured_host_engine_s": host["host_engine_s"],
            "measured_time_s": total,
            "measured_gpu_span_s": sum(s.gpu_span_s for s in self.steps),
            "measured_gpu_experts_s": sum(s.gpu_experts_s for s in self.steps),
            "measured_cpu_experts_s": sum(s.cpu_experts_s for s in self.steps),
            "measured_steps": len(self.steps),
            "gpu_peak_mem_bytes": peak,
            "gpu_peak_mem_gb": peak / 1e9,
            "gpu_expert_pool_bytes": self.pool_bytes,
            "gpu_non_expert_bytes": self.placement.non_expert_bytes,
            "host_experts_pinned": int(self.placement.host_pinned),
            "host_expert_bytes": self.placement.host_expert_bytes,
            "gpu_slots_high_water": self._high_water(),
        }


def wrap(model: LLaDA2Model, engine: OffloadEngine | HybridExecutor) -> OffloadEngine | HybridExecutor:
    """The engine itself on the host; a HybridExecutor around it on an attached model."""
    placement = placement_of(model)
    if placement is None or isinstance(engine, HybridExecutor):
        return engine
    return HybridExecutor(engine, placement)
