"""Mixtral-Offload-style LRU expert cache (docs/systems.md).

Charging, as the original (`ExpertCache.load_experts` of dvmazur/mixtral-offloading):
the experts a layer holds compute first while its misses load, at most
`max_loads_in_flight` copies at a time (the original's buffer_size - 1; its demo uses
buffer_size=4, so 3), each miss computing once its copy has landed (harness/accounting/pipeline.py
has the timeline). `max_loads_in_flight=0` charges the simpler rule: every miss copied
before any expert of the layer computes.

Per layer an LRU cache of B experts, initially experts 0..B-1 (recency in id order,
expert 0 least recent). Every routed expert is computed on the GPU. Misses are loaded
synchronously in canonical (ascending id) order into the cache, evicting the least
recently used experts that this layer does not use; when more experts are routed than
the cache can hold, the misses that do not fit are copied to a one-use scratch buffer
(evicting an expert this layer still computes is not allowed). After the layer, every
expert it used is most recent, in ascending id order.

`prefetch: true` (the tech report's speculative prefetch): the engine hands plan(l) the
hint for layer l+1 (its gate applied to layer l's hidden state, summed over tokens);
the plan for layer l carries a `LayerPlan.prefetch` of the `prefetch_k` experts with
the largest predicted load that layer l+1 does not hold, copied asynchronously into layer
l+1's cache (evicting its least recent experts). The copies start while layer l computes
and layer l+1 waits only for the prefetched experts it uses that have not landed yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import njit

from harness.common.errors import HarnessError
from harness.placement.plan import LayerPlan
from harness.placement.system import PrepareContext, System
from systems.entry import SystemEntry, cost_free


@dataclass
class MixtralOffloadConfig:
    name: str = "mixtral_offload"
    prefetch: bool = False  # speculatively prefetch layer l+1's top guesses (its gate on layer l's hidden state)
    prefetch_k: int = 8  # guesses prefetched per layer
    max_loads_in_flight: int = 3  # the original's buffer_size=4 - 1; 0: copy every miss before computing


class MixtralOffload(System):
    name = "mixtral_offload"
    config_class = MixtralOffloadConfig
    overlap = False

    def __init__(self, config: MixtralOffloadConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        prefetch, prefetch_k = self.config.prefetch, self.config.prefetch_k
        max_loads_in_flight = self.config.max_loads_in_flight
        if not isinstance(prefetch, bool):
            raise HarnessError(f"system.prefetch must be true or false (got {prefetch!r})")
        if not isinstance(prefetch_k, int) or isinstance(prefetch_k, bool) or prefetch_k < 1:
            raise HarnessError(f"system.prefetch_k must be a positive integer (got {prefetch_k!r})")
        if not isinstance(max_loads_in_flight, int) or isinstance(max_loads_in_flight, bool) or max_loads_in_flight < 0:
            raise HarnessError(
                f"system.max_loads_in_flight must be an integer >= 0 (got {max_loads_in_flight!r}); "
                "0 copies every miss before the layer computes"
            )
        self.max_loads_in_flight = max_loads_in_flight
        self.prefetch = prefetch
        self.prefetch_k = prefetch_k
        self.wants_hint = prefetch
        # per layer and expert, a recency stamp (larger: more recent; every stamp distinct):
        # the LRU order of the resident experts is the order of their stamps
        self.stamp = np.zeros((0, 0), np.int64)
        self.clock: list[int] = []  # per layer, the next stamp
        self.cached = np.zeros((0, 0), bool)  # with prefetch: per layer, what the cache holds (read for layer+1)
        self.prefetched = 0

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.capacity = ctx.experts_per_layer

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        initial = super().initial_residency(n_layers, n_experts, capacity)
        # recency in id order, expert 0 least recent
        self.stamp = np.tile(np.arange(n_experts, dtype=np.int64), (n_layers, 1))
        self.clock = [n_experts] * n_layers
        self.cached = np.zeros((n_layers, n_experts), bool)
        for layer, experts in enumerate(initial):
            self.cached[layer, list(experts)] = True
        self.capacity = capacity
        return initial

    def _touch(self, layer: int, ids: np.ndarray) -> None:
        """Make `ids` the most recent experts of `layer`, the last one most recent."""
        clock = self.clock[layer]
        self.stamp[layer][ids] = np.arange(clock, clock + len(ids))
        self.clock[layer] = clock + len(ids)

    def _least_recent(self, layer: int, candidates: np.ndarray, n: int) -> np.ndarray:
        """The `n` least recent of the expert ids `candidates`, least recent first."""
        return candidates[self.stamp[layer][candidates].argsort()[:n]] if n > 0 else candidates[:0]

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        # the engine's residency is the truth; the stamps only order it
        masks = np.empty((4, len(load)), bool)  # filled by the kernel: returning arrays from numba costs more
        self.clock[layer] = lru_layer(load, resident, self.stamp[layer], self.clock[layer], self.capacity, masks)
        routed, miss, scratch, evict = masks[0], masks[1], masks[2], masks[3]
        if self.prefetch:  # what this layer holds after the plan, for the previous layer's prefetch
            np.logical_or(resident > evict, miss > scratch, out=self.cached[layer])
        plan = LayerPlan(gpu=routed, cpu=np.zeros(len(routed), bool), fetch_sync=miss, scratch=scratch, evict=evict)
        if self.prefetch and hint is not None and layer + 1 < len(self.clock):
            plan.prefetch, plan.prefetch_evict = self._prefetch_next(layer + 1, hint)
        return plan

    def _prefetch_next(self, layer: int, hint: torch.Tensor) -> tuple[list[int], list[int]]:
        in_cache = self.cached[layer]
        predicted = hint.float()
        order = torch.sort(predicted, descending=True, stable=True).indices
        order = order[predicted[order] > 0].numpy()
        k = min(self.prefetch_k, self.capacity)
        guesses = order[~in_cache[order]][:k]
        n_evict = int(np.count_nonzero(in_cache)) + len(guesses) - self.capacity
        evict = self._least_recent(layer, np.flatnonzero(in_cache), n_evict)
        in_cache[evict] = False
        in_cache[guesses] = True
        self._touch(layer, guesses)  # the guesses, most likely first, after every cached expert
        self.prefetched += len(guesses)
        return guesses.tolist(), evict.tolist()

    def report(self) -> dict[str, object]:
        return {"prefetch": self.prefetch, "prefetched_experts": self.prefetched,
                "max_loads_in_flight": self.max_loads_in_flight}


@njit(cache=True, nogil=True)
def lru_layer(load: np.ndarray, held: np.ndarray, stamp: np.ndarray, clock: int, capacity: int,
              masks: np.ndarray) -> int:
    """One layer of the LRU cache (the module docstring's rule; compiled, it runs on every
    layer of every forward). `held`: what the layer holds; `stamp`: its experts' recency
    (updated here: every expert the layer uses, in ascending id order, from `clock` on).
    Fills masks [4, E] with routed, missed (all fetched sync), scratch (the misses that do
    not fit) and evicted (the least recent unused residents that make room); returns the
    next clock. Twin: tests/kernels/test_cache_kernels.py."""
    n = load.shape[0]
    routed, miss, scratch, evict = masks[0], masks[1], masks[2], masks[3]
    n_routed = n_miss = n_held = 0
    for e in range(n):
        routed[e] = load[e] != 0  # loads are counts: routed where nonzero
        miss[e] = routed[e] and not held[e]
        scratch[e] = evict[e] = False
        n_routed += routed[e]
        n_miss += miss[e]
        n_held += held[e]
    # slots once every unused expert is evicted
    room = max(0, capacity - (n_routed - n_miss))
    if n_miss > room:  # the first `room` misses by id stay cached, the rest are one-use copies
        seen = 0
        for e in range(n):
            if miss[e]:
                scratch[e] = seen >= room
                seen += 1
    n_evict = n_held + min(n_miss, room) - capacity
    if n_evict > 0:  # the least recent experts held and unused (stamps are distinct)
        unused = np.empty(n_held, np.int64)
        n_unused = 0
        for e in range(n):
            if held[e] and not routed[e]:
                unused[n_unused] = e
                n_unused += 1
        unused = unused[:n_unused]
        if n_evict < n_unused:  # (never more: the held experts are the hits and the unused)
            unused = unused[np.argsort(stamp[unused])[:n_evict]]
        for e in unused:
            evict[e] = True
    for e in range(n):
        if routed[e] and not scratch[e]:
            stamp[e] = clock
            clock += 1
    return clock


ENTRY = SystemEntry(
    MixtralOffload,
    MixtralOffloadConfig,
    role="baseline",
    decision_key=cost_free,  # LRU and its prefetch never ask the cost model
    invariant_options=({}, {"prefetch": True, "prefetch_k": 3}),
    golden_variants={"+prefetch": ("system.prefetch=true",)},
    about="Mixtral-Offload-style per-layer LRU cache.",
)
