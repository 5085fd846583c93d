"""The rules a system's answers must keep; `OffloadEngine` checks every plan with them.

Rules a plan must keep (a violation raises `PlanError` naming system, layer and rule):
every routed expert (load > 0) is computed exactly once, on the GPU or on the CPU, and
nothing unrouted is computed; an expert computed on the GPU is resident or fetched sync
by this plan; an evicted expert is resident and not computed on the GPU in this plan; a
fetched expert is not already resident; scratch copies are sync fetches used once on the
GPU and never cached; capacity: resident - evicted + cached sync fetches + async fetches
<= B (scratch copies do not count). A plan may also fetch asynchronously into
layer l+1's cache (evicting from it), under the same capacity rule for layer l+1.

With topology=multi (expert parallelism, harness/accounting/topology.py) every expert is resident
on one of several GPUs: a plan also names each expert's GPU (`plan.device`), computes
nothing on the CPU and moves nothing.

A system's initial residency holds, per MoE layer, at most B valid expert ids.

Checking moves nothing: `PlanRules.check` reads the residency the engine hands it (bool
masks [layers, E] and the count per layer) and returns what the engine needs to apply and
charge the plan. It runs once per layer of every forward (between the router and the
experts of a live run), so the rules on one layer's experts are checked in one compiled
pass over them (`layer_rules`, numba: a numpy operation per rule cost ~1 us each, about a
third of the live path): a plan's id field given as a bool mask [E] is used as it is (it
cannot repeat or misname an expert), one given as ids is turned into a mask once, after
the checks on ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from numba import njit

from harness.accounting.topology import Topology
from harness.placement.plan import ID_LISTS, LayerPlan, move_count, move_ids

INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

_BOOL = np.dtype(bool)
_INT64 = np.dtype(np.int64)
_NONE = np.zeros(0, np.int64)


class Moves(NamedTuple):
    """A checked plan's residency moves (what `OffloadEngine` applies): this layer's as
    bool [E] masks with their sizes, the next layer's (prefetch) as int64 id arrays."""

    cached: np.ndarray  # sync fetches that stay resident (fetch_sync - scratch)
    n_cached: int
    n_scratch: int
    fetch_async: np.ndarray  # int64 ids, in the order the copies are issued
    n_async: int
    evict: np.ndarray
    n_evict: int
    prefetch: np.ndarray  # into layer + 1
    prefetch_evict: np.ndarray  # from layer + 1


_NO_MASK = np.zeros(0, bool)  # stands for an empty mask where only the size 0 is read
NO_MOVES = Moves(_NO_MASK, 0, 0, _NONE, 0, _NO_MASK, 0, _NONE, _NONE)

# What `PlanRules.check` returns for a valid plan: (gpu, missed, moves); see there.
CheckedPlan = tuple[np.ndarray, np.ndarray, Moves]

# The rules `layer_rules` checks on each expert, in the order they are reported: bit i of an
# expert's flags is LAYER_RULES[i] (rule, message naming the first experts that break it)
LAYER_RULES = (
    ("computed-twice", "experts {} on both GPU and CPU"),
    ("routed-not-computed", "routed experts {}"),
    ("unrouted-computed", "experts {} have no tokens"),
    ("evict-not-resident", "experts {}"),
    ("fetch-resident", "experts {} are already resident or fetched twice"),
    ("scratch-not-sync", "scratch experts {} not in fetch_sync"),
    ("scratch-not-gpu", "scratch experts {} not computed on GPU"),
    ("evicted-computed-on-gpu", "experts {}"),
    ("gpu-not-resident", "experts {} neither resident nor fetched sync"),
)


@njit(cache=True, nogil=True)
def layer_rules(loads: np.ndarray, gpu: np.ndarray, cpu: np.ndarray, held: np.ndarray, sync: np.ndarray,
                in_async: np.ndarray, scratch: np.ndarray, evict: np.ndarray, missed: np.ndarray, cached: np.ndarray,
                broken: np.ndarray) -> tuple[int, int, int, int]:
    """One pass over a layer's experts (all arrays [E]; the id fields as bool masks): per
    expert the bits of the LAYER_RULES it breaks (into `broken`), whether it is a routed
    expert not held (into `missed`) and a sync fetch that stays cached (into `cached`).
    Returns (the bits any expert breaks, sync fetches, scratch copies, evictions).
    Twin: tests/kernels/test_plan_rules_kernel.py."""
    any_broken = n_sync = n_scratch = n_evict = 0
    for e in range(loads.shape[0]):  # branch-free on 0/1 integers: the loop vectorizes
        r = np.uint32(loads[e] != 0)
        g, c, h, s = np.uint32(gpu[e]), np.uint32(cpu[e]), np.uint32(held[e]), np.uint32(sync[e])
        a, x, v = np.uint32(in_async[e]), np.uint32(scratch[e]), np.uint32(evict[e])
        bits = (
            (g & c)  # computed-twice
            | (r & ((g | c) ^ 1)) << 1  # routed-not-computed
            | ((g | c) & (r ^ 1)) << 2  # unrouted-computed
            | (v & (h ^ 1)) << 3  # evict-not-resident
            | (((s | a) & h) | (s & a)) << 4  # fetch-resident
            | (x & (s ^ 1)) << 5  # scratch-not-sync
            | (x & (g ^ 1)) << 6  # scratch-not-gpu
            | (v & g) << 7  # evicted-computed-on-gpu
            | (g & ((h | s) ^ 1)) << 8  # gpu-not-resident
        )
        broken[e] = bits
        any_broken |= bits
        missed[e] = r & (h ^ 1)
        cached[e] = s & (x ^ 1)
        n_sync += s
        n_scratch += x
        n_evict += v
    return any_broken, n_sync, n_scratch, n_evict


class PlanError(AssertionError):
    def __init__(self, system: str, layer: int, rule: str, detail: str) -> None:
        super().__init__(f"system {system!r}, layer {layer}: plan breaks rule '{rule}': {detail}")
        self.system, self.layer, self.rule = system, layer, rule


def _ids(flags: np.ndarray) -> list[int]:
    return np.flatnonzero(flags).tolist()


def _some(mask: np.ndarray) -> bool:
    return bool(np.count_nonzero(mask))


class PlanRules:
    """The rules for one engine's system: its name (for the errors), the model's expert
    and MoE layer counts, the per-layer capacity B and the topology."""

    def __init__(self, system: str, n_experts: int, n_layers: int, capacity: int, topology: Topology) -> None:
        self.system = system
        self.n_experts = n_experts
        self.n_layers = n_layers
        self.capacity = capacity
        self.topology = topology
        self._shape = (n_experts,)
        self._multi = topology.multi
        self._no_mask = np.zeros(n_experts, bool)  # an empty list's mask (never written)
        self._broken = np.zeros(n_experts, np.int32)  # per expert, the rules it breaks (read on a failure)

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

    def _id_array(self, layer: int, name: str, items: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One of a plan's id lists as (int64 ids, bool [E] mask), each a valid expert id,
        none repeated."""
        if not len(items):
            return _NONE, self._no_mask
        ids = items if type(items) is np.ndarray else np.asarray(items)
        if ids.dtype == _BOOL:
            if ids.shape != self._shape:
                self._fail(layer, "bad-id", f"{name} is a bool mask of shape {ids.shape}: masks are [{self.n_experts}]")
            return np.flatnonzero(ids), ids
        if ids.dtype.kind not in "iu" or ids.ndim != 1:
            if ids.size == 0:
                return _NONE, self._no_mask
            self._fail(layer, "bad-id", f"{name} holds {list(items)[:5]}: expert ids are ints")
        ids = ids.astype(np.int64, copy=False)
        # one comparison finds ids < 0 too: they wrap to huge unsigned values
        if _some(ids.view(np.uint64) >= self.n_experts):
            self._fail(layer, "bad-id", f"{name} holds {[e for e in ids.tolist() if not 0 <= e < self.n_experts][:5]}")
        mask = np.zeros(self.n_experts, bool)
        mask[ids] = True
        if np.count_nonzero(mask) != len(ids):
            self._fail(layer, "duplicate", f"{name} lists an expert twice")
        return ids, mask

    def _mask(self, layer: int, name: str, items: Sequence[int] | np.ndarray) -> np.ndarray:
        """One of this layer's move lists as a bool [E] mask: a bool mask as it is (it
        cannot repeat an id), ids checked by `_id_array`."""
        if type(items) is np.ndarray and items.dtype == _BOOL and items.shape == self._shape:
            return items
        return self._id_array(layer, name, items)[1]

    def check(self, layer: int, loads: np.ndarray, plan: LayerPlan, held_all: np.ndarray,
              counts: list[int]) -> CheckedPlan:
        """Every rule, in the order of `LAYER_RULES`, then capacity, the prefetch's rules,
        evictions elsewhere and the devices (the first broken one raises). `loads` is the
        layer's int64 [E] load (token counts, never negative), `held_all` the engine's
        residency before the plan (bool [layers, E]: this layer's row and, for a prefetch,
        the next one's) and `counts` its experts per layer (both read, never changed).

        Returns, for a valid plan: the experts computed on the GPU and the routed experts
        not resident before the plan (bool [E] masks; every routed expert not on the GPU
        computes on the CPU) and the plan's moves (`Moves`)."""
        gpu, cpu = plan.gpu, plan.cpu
        if not (type(gpu) is np.ndarray and type(cpu) is np.ndarray and gpu.dtype == _BOOL and cpu.dtype == _BOOL
                and gpu.shape == self._shape and cpu.shape == self._shape and loads.shape == self._shape
                and loads.dtype == _INT64):
            self._check_masks(layer, loads, plan)
        moving = len(plan.fetch_sync) or len(plan.fetch_async) or len(plan.scratch) or len(plan.evict)
        if moving:
            in_sync = self._mask(layer, "fetch_sync", plan.fetch_sync)
            # async copies keep the plan's order: the ledger charges them in the order they are issued
            asyn, in_async = self._id_array(layer, "fetch_async", plan.fetch_async)
            in_scratch = self._mask(layer, "scratch", plan.scratch)
            in_evict = self._mask(layer, "evict", plan.evict)
        else:
            in_sync = in_async = in_scratch = in_evict = self._no_mask
            asyn = _NONE
        missed, cached = np.empty(self._shape, bool), np.empty(self._shape, bool)
        broken, n_sync, n_scratch, n_evict = layer_rules(
            loads, gpu, cpu, held_all[layer], in_sync, in_async, in_scratch, in_evict, missed, cached, self._broken
        )
        if broken:
            self._fail_rule(layer, broken, len(asyn))
        moves = NO_MOVES
        if moving:
            kept = counts[layer] - n_evict + n_sync - n_scratch + len(asyn)
            if kept > self.capacity:
                self._fail(layer, "capacity", f"{kept} experts resident after the plan, capacity {self.capacity}")
            moves = Moves(cached, n_sync - n_scratch, n_scratch, asyn, len(asyn), in_evict, n_evict, _NONE, _NONE)
        if len(plan.prefetch) or len(plan.prefetch_evict):
            moves = self._check_prefetch(layer, plan, held_all, counts, moves)
        if plan.evict_elsewhere:
            self._check_elsewhere(layer, plan, held_all)
        if self._multi:
            self._check_devices(layer, plan, _some(cpu))
        return gpu, missed, moves

    def _fail_rule(self, layer: int, broken: int, n_async: int) -> None:
        """Raise for the first rule of `LAYER_RULES` the plan breaks, naming its first experts."""
        bit = broken & -broken
        rule, detail = LAYER_RULES[bit.bit_length() - 1]
        if rule == "fetch-resident" and not n_async:
            detail = "experts {} are already resident"
        self._fail(layer, rule, detail.format(np.flatnonzero(self._broken & bit)[:5].tolist()))

    def _check_masks(self, layer: int, loads: np.ndarray, plan: LayerPlan) -> None:
        """The shapes and types of the load and of plan.gpu / plan.cpu; called once one is off."""
        E = self.n_experts
        if not (isinstance(loads, np.ndarray) and loads.shape == self._shape and loads.dtype == np.int64):
            raise ValueError(f"layer {layer}: the load must be an int64 numpy array [{E}]")
        for name in ("gpu", "cpu"):
            mask = getattr(plan, name)
            if not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == self._shape):
                hint = " (a torch tensor: pass mask.numpy())" if isinstance(mask, torch.Tensor) else ""
                self._fail(layer, "shape", f"plan.{name} must be a numpy bool array [{E}]{hint}")

    def _check_devices(self, layer: int, plan: LayerPlan, any_cpu: bool) -> None:
        """Expert parallelism: every expert on one of the GPUs, nothing offloaded."""
        device, E, G = plan.device, self.n_experts, self.topology.n_gpus
        if not (isinstance(device, torch.Tensor) and device.shape == (E,)) or device.dtype not in INT_DTYPES:
            self._fail(layer, "device", f"topology=multi needs plan.device, an int tensor [{E}]")
        if int(device.min()) < 0 or int(device.max()) >= G:
            self._fail(layer, "device", f"plan.device names GPUs outside 0..{G - 1}")
        if any_cpu or len(plan.evict_elsewhere) or any(move_count(getattr(plan, name)) for name in ID_LISTS):
            self._fail(layer, "multi-gpu-offload", "topology=multi keeps every expert resident: no CPU, no moves")

    def _check_elsewhere(self, layer: int, plan: LayerPlan, held_all: np.ndarray) -> None:
        """Evictions in other layers: resident there, each once, never this layer's own
        (plan.evict) nor an expert this plan prefetches."""
        pairs = plan.evict_elsewhere
        if len(set(pairs)) != len(pairs):
            self._fail(layer, "duplicate", "evict_elsewhere lists a (layer, expert) twice")
        prefetched = set(move_ids(plan.prefetch).tolist())
        for other, e in pairs:
            if not (0 <= other < self.n_layers) or other == layer:
                self._fail(layer, "evict-elsewhere-layer",
                           f"evict_elsewhere names layer {other}: another MoE layer than {layer} is required")
            if not (0 <= e < self.n_experts and held_all[other, e]):
                self._fail(layer, "evict-elsewhere-not-resident", f"layer {other} expert {e}")
            if other == layer + 1 and e in prefetched:
                self._fail(layer, "evict-elsewhere-prefetched", f"layer {other} expert {e} is also prefetched")

    def _check_prefetch(self, layer: int, plan: LayerPlan, held_all: np.ndarray, counts: list[int],
                        moves: Moves) -> Moves:
        if layer + 1 >= self.n_layers:
            self._fail(layer, "prefetch-last-layer", "the last MoE layer has no next layer to prefetch into")
        nxt = held_all[layer + 1]
        fetch, _ = self._id_array(layer, "prefetch", plan.prefetch)
        evict, _ = self._id_array(layer, "prefetch_evict", plan.prefetch_evict)
        if len(evict) and np.count_nonzero(nxt[evict]) != len(evict):
            self._fail(layer, "prefetch-evict-not-resident",
                       f"layer {layer + 1} experts {[e for e in evict.tolist() if not nxt[e]][:5]}")
        if _some(nxt[fetch]):
            self._fail(layer, "prefetch-resident",
                       f"layer {layer + 1} experts {[e for e in fetch.tolist() if nxt[e]][:5]}")
        kept = counts[layer + 1] - len(evict) + len(fetch)
        if kept > self.capacity:
            self._fail(layer, "prefetch-capacity", f"layer {layer + 1} would hold {kept}")
        return moves._replace(prefetch=fetch, prefetch_evict=evict)
