"""DALI-style workload-aware offloading (docs/systems.md).

Three parts, each of which can be switched off for an ablation:

assign (greedy 0-1 assignment). Per step and layer, every routed expert goes to the GPU
    or the CPU so that the layer's finish time

        Phi = max(sum_GPU (gpu(n_e) + copy(e)), sum_CPU cpu(n_e))

    is small, where copy(e) is one expert copy for a GPU expert that is not resident (CPU
    and GPU run concurrently: overlap). Heaviest expert (most tokens) first, each goes to
    the side whose finish time after taking it is smaller (ties: the side where it costs
    less); then single moves and GPU/CPU swaps while one lowers Phi (token order
    misjudges an expert whose copy makes it dear on the GPU). Bound: a two-machine
    unrelated-machines greedy; each placement raises the running Phi by at most
    min(gpu side cost, cpu cost) of that expert and the optimum is at least half the sum
    of those minima, so Phi <= 2 * Phi_opt (the refinement only lowers Phi). Measured
    against brute force: worst 1.49 over 100,000 random cases of up to 9 routed experts;
    on the test's 1,500 fixed cases mean 1.002, optimal in ~96% (tests/unit/test_dali.py).
    Off: every resident routed expert on the GPU, every other one on the CPU (no sync
    copies: the cache changes only through prefetch).
prefetch (residual-based). The engine hands plan(l) the hint for layer l+1 (its gate
    applied to layer l's hidden state, the residual stream, summed over tokens); the
    experts it predicts heaviest that layer l+1 does not hold are copied asynchronously
    into layer l+1's cache, never evicting one of layer l+1's predicted top-B: at most
    `prefetch_k`, and only as many as fit in the link's idle time while layer l computes
    (its finish time minus its own sync copies), since the link is shared and a later
    prefetch would delay layer l+1's sync copies. Off: no speculative copies; layer l+1
    fetches on demand (the greedy's sync copies) or runs on the CPU.
replacement (workload-aware). Per layer a decayed workload score s_e <- decay * s_e + n_e,
    updated every forward. A copied expert enters the cache in place of the lowest-score
    resident this layer does not use on the GPU, and only if its own score is higher;
    otherwise it is copied to a one-use scratch buffer. Prefetches evict the lowest-score
    resident too. Off: LRU, as in mixtral_offload: the least recently used resident goes,
    and a copied expert is always cached while something can be evicted.

The initial residency is experts 0..B-1 of every layer (no calibration).

budget.scope=global (B x L experts in total, any split): replacement ranks over the whole
model. A copied expert takes a free slot anywhere, else the lowest-score resident of any
layer (the LRU one without replacement) that this layer does not compute on the GPU;
evictions in other layers go in plan.evict_elsewhere. Prefetches make room the same way,
never evicting layer l+1's predicted top-B. So layers with heavier workloads come to hold
more experts than others.
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
from systems.dali_assign import assign_layer, finish_time
from systems.entry import SystemEntry


@dataclass
class DaliConfig:
    name: str = "dali"
    assign: bool = True  # the greedy GPU/CPU assignment (false: resident on the GPU, the rest on the CPU, no copies)
    prefetch: bool = True  # copy the next layer's predicted-heaviest missing experts ahead, in the link's idle time
    replacement: bool = True  # evict the lowest decayed workload score (false: LRU)
    prefetch_k: int = 4  # prefetched experts per layer
    decay: float = 0.5  # score <- decay * score + tokens, per forward
    overlap: bool = True  # DALI runs the CPU and GPU sides concurrently; false charges them one after the other


def workload_decay(config: DaliConfig) -> float:
    """The decay of this run's workload score (its replacement rule's), for the cache replay
    of DALI's measures."""
    return float(config.decay)


class Dali(System):
    name = "dali"
    config_class = DaliConfig
    overlap = True

    def __init__(self, config: DaliConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        c = self.config
        assign, prefetch, replacement, prefetch_k, decay = c.assign, c.prefetch, c.replacement, c.prefetch_k, c.decay
        for key, value in (("assign", assign), ("prefetch", prefetch), ("replacement", replacement)):
            if not isinstance(value, bool):
                raise HarnessError(f"system.{key} must be true or false (got {value!r})")
        if not isinstance(prefetch_k, int) or isinstance(prefetch_k, bool) or prefetch_k < 1:
            raise HarnessError(f"system.prefetch_k must be a positive integer (got {prefetch_k!r})")
        if not 0 <= float(decay) < 1:
            raise HarnessError(f"system.decay must be in [0, 1) (got {decay!r})")
        self.assign, self.prefetch, self.replacement = assign, prefetch, replacement
        self.prefetch_k, self.decay = prefetch_k, float(decay)
        self.wants_hint = prefetch
        self.held = np.zeros((0, 0), bool)  # [L, E] mirror of the engine's residency (for layer + 1)
        self.score = np.zeros((0, 0))  # [L, E] decayed workload
        self.last_use = np.zeros((0, 0))  # [L, E] tick of the last GPU use or arrival (LRU)
        self.tick = 0
        self.counts = {"gpu_experts": 0, "cpu_experts": 0, "cached": 0, "scratch": 0, "prefetched": 0}

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.capacity = ctx.experts_per_layer
        self.global_scope = ctx.budget_scope == "global"

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        initial = super().initial_residency(n_layers, n_experts, capacity)
        self.capacity = capacity
        self.held = np.zeros((n_layers, n_experts), bool)
        for layer, experts in enumerate(initial):
            self.held[layer, list(experts)] = True
        self.total = capacity * n_layers  # under budget.scope=global
        self.score = np.zeros((n_layers, n_experts))
        # recency in id order, expert 0 least recent (as mixtral_offload)
        self.last_use = np.tile(np.arange(n_experts, dtype=np.float64), (n_layers, 1)) - n_experts
        return initial

    # ---- one layer -----------------------------------------------------------------
    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        self.tick += 1
        self.held[layer] = resident  # the engine's residency is the truth
        loads, held = load, resident
        self.score[layer] = self.decay * self.score[layer] + loads.astype(np.float64)
        routed = loads > 0
        finish = None  # the layer's Phi, for the prefetch's room (the assignment has it)
        if self.assign:
            on_gpu = np.zeros(loads.shape[0], bool)
            finish = assign_layer(loads, held, self.ctx.cost, on_gpu)
        else:
            on_gpu = routed & held
        cpu = routed & ~on_gpu
        elsewhere: list[tuple[int, int]] = []
        if self.global_scope:
            fetch = np.flatnonzero(on_gpu & ~held).tolist()
            cached, scratch, evict, elsewhere = self._admit_global(layer, fetch, on_gpu)
            n_fetch, n_cached, n_scratch = len(fetch), len(cached), len(scratch)
            fetch, scratch = sorted(fetch), sorted(scratch)
        else:
            moves = np.zeros((3, loads.shape[0]), bool)  # filled by the kernel: returning arrays from numba costs more
            key = self.score[layer] if self.replacement else self.last_use[layer]
            n_cached, n_scratch = admit_layer(on_gpu, self.held[layer], self.score[layer], key, self.capacity,
                                              self.replacement, moves)
            n_fetch = n_cached + n_scratch
            fetch, scratch, evict = moves[0], moves[1], moves[2]
        self.last_use[layer, on_gpu] = self.tick
        self.counts["gpu_experts"] += int(np.count_nonzero(on_gpu))
        self.counts["cpu_experts"] += int(np.count_nonzero(cpu))
        self.counts["cached"] += n_cached
        self.counts["scratch"] += n_scratch
        plan = LayerPlan(
            gpu=on_gpu, cpu=cpu, fetch_sync=fetch, scratch=scratch, evict=evict, evict_elsewhere=elsewhere,
            prefetch=[],  # extended by prefetching
        )
        if self.prefetch and hint is not None and layer + 1 < self.held.shape[0]:
            if finish is None:
                finish = finish_time(on_gpu, loads, held, self.ctx.cost)
            room = self._idle_link_copies(finish, n_fetch)
            if self.global_scope:
                self._prefetch_global(layer, plan, hint, room, on_gpu)
            else:
                plan.prefetch, plan.prefetch_evict = self._prefetch(layer + 1, hint, room)
        return plan

    def _idle_link_copies(self, finish: float, n_sync: int) -> int:
        """Copies that fit in the link's idle time while this layer computes: the layer
        lasts its finish time, its sync copies hold the link first. A prefetch beyond that
        would delay the next layer's own sync copies on the shared link."""
        cost = self.ctx.cost
        return max(0, int((finish - cost.copy_time(n_sync)) / cost.copy_time(1)))

    def _victims(self, layer: int, candidates: np.ndarray) -> list[int]:
        """Eviction order among the experts of the mask `candidates`: lowest score
        (replacement) or least recent, ties to the lower id."""
        key = self.score[layer] if self.replacement else self.last_use[layer]
        ids = np.flatnonzero(candidates)
        return ids[np.argsort(key[ids], kind="stable")].tolist()

    def _prefetch(self, layer: int, hint: torch.Tensor, room: int) -> tuple[list[int], list[int]]:
        """Copy layer `layer`'s predicted-heaviest missing experts in (at most `room` of
        them), keeping its predicted top-B."""
        held = self.held[layer]
        order = _predicted_order(hint)
        protected = np.zeros(held.shape[0], bool)
        protected[order[: self.capacity]] = True
        guesses = order[~held[order]][: min(self.prefetch_k, self.capacity, room)].tolist()
        room = self.capacity - int(np.count_nonzero(held))
        victims = self._victims(layer, held & ~protected)
        fetch, evict = [], []
        for e in guesses:
            if room > 0:
                room -= 1
            elif victims:
                evict.append(victims.pop(0))
            else:
                break
            fetch.append(e)
        held[evict] = False
        held[fetch] = True
        self.last_use[layer, fetch] = self.tick
        self.counts["prefetched"] += len(fetch)
        return fetch, evict

    # ---- budget.scope=global -------------------------------------------------------
    def _global_victims(self, keep: dict[int, set[int]]) -> list[tuple[int, int]]:
        """Every resident (layer, expert) but those in `keep`, in eviction order: lowest
        score (replacement) or least recent first; ties to the lower layer, then the lower id."""
        key = self.score if self.replacement else self.last_use
        pairs = [(float(key[layer, e]), layer, e) for layer, held in enumerate(self.held)
                 for e in np.flatnonzero(held).tolist() if e not in keep.get(layer, ())]
        pairs.sort()
        return [(layer, e) for _, layer, e in pairs]

    def _free_slots(self) -> int:
        return self.total - int(np.count_nonzero(self.held))

    def _drop(self, layer: int, victim: tuple[int, int], evict: list[int], elsewhere: list[tuple[int, int]]) -> None:
        """Evict `victim`: into `evict` if it is `layer`'s own, else into `elsewhere`."""
        other, e = victim
        if other == layer:
            evict.append(e)
        else:
            elsewhere.append(victim)
        self.held[other, e] = False

    def _admit_global(self, layer: int, fetch: list[int], on_gpu: np.ndarray
                      ) -> tuple[list[int], list[int], list[int], list[tuple[int, int]]]:
        """`admit_layer` over the whole model: free slots anywhere, then the model-wide victims."""
        held = self.held[layer]
        room = self._free_slots()
        keep = {layer: {int(e) for e in np.flatnonzero(on_gpu)}}
        victims = self._global_victims(keep) if len(fetch) > room else []
        key = self.score if self.replacement else self.last_use
        cached, scratch, evict, elsewhere = [], [], [], []
        for e in sorted(fetch, key=lambda e: (-float(self.score[layer, e]), e)):
            if room > 0:
                room -= 1
                cached.append(e)
            elif victims and (not self.replacement or self.score[layer, e] > key[victims[0]]):
                self._drop(layer, victims.pop(0), evict, elsewhere)
                cached.append(e)
            else:
                scratch.append(e)
        held[cached] = True
        return cached, scratch, evict, elsewhere

    def _prefetch_global(self, layer: int, plan: LayerPlan, hint: torch.Tensor, room: int,
                         on_gpu: np.ndarray) -> None:
        """_prefetch into layer+1 with room made anywhere: never one of layer+1's predicted
        top-B, nor an expert this layer computes on the GPU or has just cached."""
        nxt = layer + 1
        held = self.held[nxt]
        order = _predicted_order(hint)
        dropped = [e for other, e in plan.evict_elsewhere if other == nxt]  # by this plan's admission
        wanted = ~held[order] & ~np.isin(order, dropped)
        guesses = order[wanted][: min(self.prefetch_k, self.capacity, room)].tolist()
        order = order.tolist()
        if not guesses:
            return
        free = self._free_slots()
        keep = {nxt: set(order[: self.capacity]),
                layer: {int(e) for e in np.flatnonzero(on_gpu)} | set(plan.fetch_sync)}
        victims = self._global_victims(keep) if len(guesses) > free else []
        evict: list[int] = []
        elsewhere: list[tuple[int, int]] = []
        for e in guesses:
            if free > 0:
                free -= 1
            elif victims:
                self._drop(nxt, victims.pop(0), evict, elsewhere)
            else:
                break
            plan.prefetch.append(e)
        plan.prefetch_evict = evict
        for other, e in elsewhere:  # this layer's own victims are plan.evict
            if other == layer:
                plan.evict.append(e)
            else:
                plan.evict_elsewhere.append((other, e))
        held[plan.prefetch] = True
        self.last_use[nxt, plan.prefetch] = self.tick
        self.counts["prefetched"] += len(plan.prefetch)

    def report(self) -> dict[str, Any]:
        return {
            "assign": self.assign,
            "prefetch": self.prefetch,
            "replacement": self.replacement,
            **{f"dali_{k}": v for k, v in self.counts.items()},
        }


def _predicted_order(hint: torch.Tensor) -> np.ndarray:
    """The experts the hint predicts a load for, heaviest first (ties: lower id first)."""
    predicted = hint.double().numpy()
    order = np.argsort(-predicted, kind="stable")
    return order[predicted[order] > 0]


@njit(cache=True, nogil=True)
def admit_layer(on_gpu: np.ndarray, held: np.ndarray, score: np.ndarray, key: np.ndarray, capacity: int,
                replacement: bool, moves: np.ndarray) -> tuple[int, int]:
    """Which of the layer's copied experts (on the GPU, not held) stay cached, and whom
    they evict; into moves [3, E]: fetch_sync, scratch, evict. The copies go heaviest
    score first (ties: lower id), into a free slot, else in place of the next victim: the
    held experts this layer does not compute on the GPU, lowest `key` first (ties: lower
    id), and with replacement only when the copy's score is higher; else to scratch.
    Updates `held`; returns (cached, scratch). `moves` comes zeroed.
    Twin: tests/kernels/test_cache_kernels.py."""
    fetch_mask, scratch_mask, evict_mask = moves[0], moves[1], moves[2]
    n_held = 0
    for e in range(held.shape[0]):
        n_held += held[e]
    fetch = np.flatnonzero(on_gpu & ~held)
    victims = np.flatnonzero(held & ~on_gpu)
    victims = victims[np.argsort(key[victims], kind="mergesort")]
    room, next_victim, n_cached = capacity - n_held, 0, 0
    for e in fetch[np.argsort(-score[fetch], kind="mergesort")]:
        fetch_mask[e] = True
        if room > 0:
            room -= 1
        elif next_victim < len(victims) and (not replacement or score[e] > score[victims[next_victim]]):
            evict_mask[victims[next_victim]] = True
            next_victim += 1
        else:
            scratch_mask[e] = True
            continue
        n_cached += 1
    for e in range(held.shape[0]):
        held[e] = (held[e] and not evict_mask[e]) or (fetch_mask[e] and not scratch_mask[e])
    return n_cached, len(fetch) - n_cached


ENTRY = SystemEntry(
    Dali,
    DaliConfig,
    # each of its three parts switched off, and other prefetch and decay settings
    invariant_options=({}, {"assign": False}, {"prefetch": False}, {"replacement": False},
                       {"prefetch_k": 2, "decay": 0.0}),
    measure_decay=workload_decay,
    about="DALI-style workload-aware offloading: greedy GPU/CPU assignment, residual prefetch, workload-aware "
          "replacement.",
)
