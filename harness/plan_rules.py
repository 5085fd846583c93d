"""The rules a system's answers must keep; `OffloadEngine` checks every plan with them.

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
nothing on the CPU and moves nothing.

A system's initial residency holds, per MoE layer, at most B valid expert ids.

Checking moves nothing: `PlanRules.check` reads the residency the engine hands it and
returns what the engine needs to apply and charge the plan. It runs once per layer of
every forward, so each test is the set rule itself written for the common case (a valid
plan with few moves); the per-rule tests that name a broken rule run only once a fast one fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from harness.topology import Topology
from systems.base import LayerPlan

INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

_NO_IDS: frozenset[int] = frozenset()
_INT_TYPE = {int}

# What `PlanRules.check` returns for a valid plan: (loads, gpu, routed, missed, scratch); see there.
CheckedPlan = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, set[int] | frozenset[int]]


class PlanError(AssertionError):
    def __init__(self, system: str, layer: int, rule: str, detail: str) -> None:
        super().__init__(f"system {system!r}, layer {layer}: plan breaks rule '{rule}': {detail}")
        self.system, self.layer, self.rule = system, layer, rule


def _flags(mask: torch.Tensor) -> np.ndarray:
    """A bool [E] tensor as numpy (a view on the CPU)."""
    return mask.numpy() if mask.device.type == "cpu" else mask.cpu().numpy()


def _ids(flags: np.ndarray) -> list[int]:
    return np.flatnonzero(flags).tolist()


class PlanRules:
    """The rules for one engine's system: its name (for the errors), the model's expert
    and MoE layer counts, the per-layer capacity B and the topology."""

    def __init__(self, system: str, n_experts: int, n_layers: int, capacity: int, topology: Topology) -> None:
        self.system = system
        self.n_experts = n_experts
        self.n_layers = n_layers
        self.capacity = capacity
        self.topology = topology
        self._expert_ids = frozenset(range(n_experts))

    def _fail(self, layer: int, rule: str, detail: str) -> None:
        raise PlanError(self.system, layer, rule, detail)

    def check_initial(self, initial: Sequence[Any]) -> None:
        """A system's `initial_residency`: one collection of expert ids per MoE layer,
        each id valid, at most `capacity` per layer."""
        if len(initial) != self.n_layers:
            raise PlanError(self.system, -1, "initial-residency", f"{len(initial)} layers, expected {self.n_layers}")
        for layer, experts in enumerate(initial):
            bad = [e for e in experts if not 0 <= e < self.n_experts]
            if bad or len(experts) > self.capacity:
                raise PlanError(
                    self.system,
                    layer,
                    "initial-residency",
                    f"{len(experts)} experts (capacity {self.capacity}), bad ids {bad}",
                )

    def _check_list(self, layer: int, name: str, items: list[int]) -> set[int] | frozenset[int]:
        if not len(items):
            return _NO_IDS
        try:
            ids = set(items)
        except TypeError:  # unhashable entries: bad ids, reported below
            ids = set()
        if len(ids) == len(items) and ids <= self._expert_ids and set(map(type, ids)) == _INT_TYPE:
            return ids  # plain ints in range, no repeats: the rules below hold
        bad = [e for e in items if not (isinstance(e, int) and 0 <= e < self.n_experts)]
        if bad:
            self._fail(layer, "bad-id", f"{name} holds {bad[:5]}")
        if len(set(items)) != len(items):
            self._fail(layer, "duplicate", f"{name} lists an expert twice")
        return set(items)

    def check(self, layer: int, load: torch.Tensor, plan: LayerPlan, residency: list[set[int]],
              held: np.ndarray) -> CheckedPlan:
        """Every rule, in this order (the first broken one raises). `load` is the layer's
        int64 [E] load on the CPU, `residency` the engine's resident experts per layer
        before the plan (this layer's and, for a prefetch, the next one's) and `held` this
        layer's as a bool [E] mask (both read, never changed). Each test is the rule itself,
        written for the common case (few moves) so that a valid plan costs a few array and
        set operations.

        Returns, for a valid plan: the load as numpy (a view), the experts computed on
        the GPU, the routed experts and the routed experts not resident before the plan
        (bool [E] masks; every routed expert not on the GPU computes on the CPU) and
        plan.scratch as a set."""
        resident = residency[layer]
        E = self.n_experts
        gpu_t, cpu_t = plan.gpu, plan.cpu
        for name, mask in (("gpu", gpu_t), ("cpu", cpu_t)):
            if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.shape == (E,)):
                self._fail(layer, "shape", f"plan.{name} must be a bool tensor [{E}]")
        loads = load.numpy()
        routed = loads > 0
        gpu, cpu = _flags(gpu_t), _flags(cpu_t)
        fetch_sync, fetch_async, scratch_ids, evict_ids = plan.fetch_sync, plan.fetch_async, plan.scratch, plan.evict
        sync = self._check_list(layer, "fetch_sync", fetch_sync) if len(fetch_sync) else _NO_IDS
        asyn = self._check_list(layer, "fetch_async", fetch_async) if len(fetch_async) else _NO_IDS
        scratch = self._check_list(layer, "scratch", scratch_ids) if len(scratch_ids) else _NO_IDS
        evict = self._check_list(layer, "evict", evict_ids) if len(evict_ids) else _NO_IDS
        # gpu and cpu split the routed experts exactly when, per expert, they are set as
        # many times (0 or 1) as it is routed (bool bytes are 0 or 1: compare the bytes)
        if loads.shape[0] != E or (gpu.view(np.uint8) + cpu.view(np.uint8)).tobytes() != routed.tobytes():
            self._check_routing(layer, set(_ids(routed)), set(_ids(gpu)), set(_ids(cpu)))
        if evict and not resident.issuperset(evict):
            self._fail(layer, "evict-not-resident", f"experts {sorted(evict - resident)[:5]}")
        if (sync or asyn) and (
            ((sync | asyn) & resident or sync & asyn) if asyn else not resident.isdisjoint(sync)
        ):
            self._fail(
                layer,
                "fetch-resident",
                f"experts {sorted(((sync | asyn) & resident) | (sync & asyn))[:5]}"
                " are already resident or fetched twice",
            )
        if scratch and not scratch <= sync:
            self._fail(
                layer, "scratch-not-sync", f"scratch experts {sorted(scratch - sync)[:5]} not in fetch_sync"
            )
        if scratch and not gpu[scratch_ids].all():
            self._fail(
                layer, "scratch-not-gpu",
                f"scratch experts {sorted(e for e in scratch if not gpu[e])[:5]} not computed on GPU",
            )
        if evict and gpu[evict_ids].any():
            self._fail(layer, "evicted-computed-on-gpu", f"experts {sorted(e for e in evict if gpu[e])[:5]}")
        # GPU experts not resident now must each be fetched sync (they are this layer's GPU
        # misses); gpu is a subset of routed (checked above), so they are among the misses
        missed = np.greater(routed, held)
        if np.count_nonzero(missed):
            not_resident = gpu & missed
            n_not_resident = np.count_nonzero(not_resident)
            # each is fetched sync when all of them are among fetch_sync (no repeats: checked)
            if n_not_resident and (not sync or np.count_nonzero(not_resident[fetch_sync]) != n_not_resident):
                ids = set(_ids(not_resident))
                self._fail(
                    layer, "gpu-not-resident", f"experts {sorted(ids - sync)[:5]} neither resident nor fetched sync"
                )
        # len(resident - evict) + len(sync - scratch) + len(asyn): evict is resident and
        # scratch is sync (both checked above), and no list repeats an expert
        kept = len(resident) - len(evict) + len(sync) - len(scratch) + len(asyn)
        if kept > self.capacity:
            self._fail(layer, "capacity", f"{kept} experts resident after the plan, capacity {self.capacity}")
        if plan.prefetch or plan.prefetch_evict:
            self._check_prefetch(layer, plan, residency)
        if plan.evict_elsewhere:
            self._check_elsewhere(layer, plan, residency)
        if self.topology.multi:
            self._check_devices(layer, plan, set(_ids(cpu)))
        return loads, gpu, routed, missed, scratch

    def _check_routing(self, layer: int, routed: set[int], gpu: set[int], cpu: set[int]) -> None:
        """The three rules on where the routed experts compute; called once one is broken."""
        if gpu & cpu:
            self._fail(layer, "computed-twice", f"experts {sorted(gpu & cpu)[:5]} on both GPU and CPU")
        if routed - gpu - cpu:
            self._fail(layer, "routed-not-computed", f"routed experts {sorted(routed - gpu - cpu)[:5]}")
        if (gpu | cpu) - routed:
            self._fail(
                layer, "unrouted-computed", f"experts {sorted((gpu | cpu) - routed)[:5]} have no tokens"
            )
        raise AssertionError(f"layer {layer}: the GPU and CPU experts do not split the routed ones")

    def _check_devices(self, layer: int, plan: LayerPlan, cpu: set[int]) -> None:
        """Expert parallelism: every expert on one of the GPUs, nothing offloaded."""
        device, E, G = plan.device, self.n_experts, self.topology.n_gpus
        if not (isinstance(device, torch.Tensor) and device.shape == (E,)) or device.dtype not in INT_DTYPES:
            self._fail(layer, "device", f"topology=multi needs plan.device, an int tensor [{E}]")
        if int(device.min()) < 0 or int(device.max()) >= G:
            self._fail(layer, "device", f"plan.device names GPUs outside 0..{G - 1}")
        if (cpu or plan.fetch_sync or plan.fetch_async or plan.evict or plan.prefetch or plan.prefetch_evict
                or plan.evict_elsewhere):
            self._fail(layer, "multi-gpu-offload", "topology=multi keeps every expert resident: no CPU, no moves")

    def _check_elsewhere(self, layer: int, plan: LayerPlan, residency: list[set[int]]) -> None:
        """Evictions in other layers: resident there, each once, never this layer's own
        (plan.evict) nor an expert this plan prefetches."""
        pairs = plan.evict_elsewhere
        if len(set(pairs)) != len(pairs):
            self._fail(layer, "duplicate", "evict_elsewhere lists a (layer, expert) twice")
        prefetched = set(plan.prefetch)
        for other, e in pairs:
            if not (0 <= other < self.n_layers) or other == layer:
                self._fail(layer, "evict-elsewhere-layer",
                           f"evict_elsewhere names layer {other}: another MoE layer than {layer} is required")
            if e not in residency[other]:
                self._fail(layer, "evict-elsewhere-not-resident", f"layer {other} expert {e}")
            if other == layer + 1 and e in prefetched:
                self._fail(layer, "evict-elsewhere-prefetched", f"layer {other} expert {e} is also prefetched")

    def _check_prefetch(self, layer: int, plan: LayerPlan, residency: list[set[int]]) -> None:
        if layer + 1 >= self.n_layers:
            self._fail(layer, "prefetch-last-layer", "the last MoE layer has no next layer to prefetch into")
        nxt = residency[layer + 1]
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
