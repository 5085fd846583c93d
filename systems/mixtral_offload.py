"""Mixtral-Offload-style LRU expert cache (DESIGN section 7).

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

import numpy as np
import torch

from harness.errors import HarnessError
from systems.base import LayerPlan, PrepareContext, System


@dataclass
class MixtralOffloadConfig:
    name: str = "mixtral_offload"
    prefetch: bool = False
    prefetch_k: int = 8


class MixtralOffload(System):
    name = "mixtral_offload"
    overlap = False

    def __init__(self, prefetch: bool = False, prefetch_k: int = 8) -> None:
        super().__init__(prefetch=prefetch, prefetch_k=prefetch_k)
        if not isinstance(prefetch, bool):
            raise HarnessError(f"system.prefetch must be true or false (got {prefetch!r})")
        if not isinstance(prefetch_k, int) or isinstance(prefetch_k, bool) or prefetch_k < 1:
            raise HarnessError(f"system.prefetch_k must be a positive integer (got {prefetch_k!r})")
        self.prefetch = prefetch
        self.prefetch_k = prefetch_k
        self.wants_hint = prefetch
        self.lru: list[list[int]] = []  # per layer, least recent first
        self.prefetched = 0

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.capacity = ctx.experts_per_layer

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        initial = super().initial_residency(n_layers, n_experts, capacity)
        self.lru = [sorted(experts) for experts in initial]
        self.capacity = capacity
        return initial

    def plan(
        self, layer: int, load: torch.Tensor, hint: torch.Tensor | None, resident: frozenset[int]
    ) -> LayerPlan:
        lru = [e for e in self.lru[layer] if e in resident]  # the engine's residency is the truth
        routed_mask = load.numpy() > 0
        routed = np.flatnonzero(routed_mask).tolist()
        hits = [e for e in routed if e in resident]
        misses = [e for e in routed if e not in resident]
        room = max(0, self.capacity - len(hits))  # slots once every unused expert is evicted
        cached, scratch = misses[:room], misses[room:]
        n_evict = max(0, len(lru) + len(cached) - self.capacity)
        used = set(routed)
        evict = [e for e in lru if e not in used][:n_evict]
        kept = [e for e in lru if e not in used and e not in evict]
        self.lru[layer] = kept + sorted(hits + cached)
        plan = LayerPlan(
            gpu=torch.from_numpy(routed_mask),
            cpu=torch.from_numpy(np.zeros_like(routed_mask)),
            fetch_sync=cached + scratch,
            scratch=scratch,
            evict=evict,
        )
        if self.prefetch and hint is not None and layer + 1 < len(self.lru):
            plan.prefetch, plan.prefetch_evict = self._prefetch_next(layer + 1, hint)
        return plan

    def _prefetch_next(self, layer: int, hint: torch.Tensor) -> tuple[list[int], list[int]]:
        lru = self.lru[layer]
        held = set(lru)
        predicted = hint.float()
        order = torch.sort(predicted, descending=True, stable=True).indices
        order = order[predicted[order] > 0].tolist()
        k = min(self.prefetch_k, self.capacity)
        guesses = [e for e in order if e not in held][:k]
        n_evict = max(0, len(lru) + len(guesses) - self.capacity)
        evict = lru[:n_evict]
        self.lru[layer] = lru[n_evict:] + guesses
        self.prefetched += len(guesses)
        return guesses, evict

    def report(self) -> dict[str, object]:
        return {"prefetch": self.prefetch, "prefetched_experts": self.prefetched}
