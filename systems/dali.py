"""DALI-style workload-aware offloading (docs/systems.md).

Three parts, each of which can be switched off for an ablation:

assign (greedy 0-1 assignment). Per step and layer, every expert goes to the GPU or the
    CPU so that the layer's finish time

        Phi = max(sum_GPU (gpu(n_e) + copy(e)), sum_CPU cpu(n_e))

    is small, where copy(e) is one expert copy for a GPU expert that is not resident (CPU
    and GPU run concurrently: overlap), under the GPU memory limit (`gpu_limit=true`): at
    most B experts of the layer on the GPU, so every copy takes a slot in the cache and no
    scratch buffer is used beyond the budget. The loads it decides from are the predicted
    ones (`assign_loads=predicted`, the paper's setting: the hint the previous layer handed
    for this layer, scaled to this forward's routed pairs and rounded by largest
    remainders; layer 0, and a forward without a hint, use the exact loads); a routed
    expert the prediction did not name runs on the GPU if resident, else on the CPU, and
    copies the prediction asked for go to the CPU (least predicted first) if that would
    overflow the B slots. `assign_loads=exact` decides from the forward's own loads (no
    prediction error). Heaviest expert (most tokens) first, each goes to
    the side whose finish time after taking it is smaller (ties: the side where it costs
    less); then single moves and GPU/CPU swaps while one lowers Phi (token order
    misjudges an expert whose copy makes it dear on the GPU). Bound: a two-machine
    unrelated-machines greedy; each placement raises the running Phi by at most
    min(gpu side cost, cpu cost) of that expert and the optimum is at least half the sum
    of those minima, so Phi <= 2 * Phi_opt without the limit (the refinement only lowers
    Phi; with it a move to the GPU needs a free slot, and the bound is not claimed). Measured
    against brute force: worst 1.49 over 100,000 random cases of up to 9 routed experts;
    on the test's 1,500 fixed cases mean 1.002, optimal in ~96% (tests/unit/test_dali.py).
    Off: every resident routed expert on the GPU, every other one on the CPU (no sync
    copies: the cache changes only through prefetch).
prefetch (residual-based). The engine hands plan(l) the hint for layer l+1 of the
    channel `predictor` names (harness/model/hints.py; docs/dali-and-gem.md "Prefetch: the
    predictor"): `residual` (default, the harness's reading of the paper) is layer l+1's
    gate applied to layer l's router input minus that layer's running mean, `next_gate`
    (the earlier harness's) the same gate on the input itself, each summed over tokens; the
    experts it predicts heaviest that layer l+1 does not hold are copied asynchronously
    into layer l+1's cache, never evicting one of layer l+1's predicted top-B: at most
    `prefetch_k`, and only as many as fit in the link's idle time while layer l computes
    (its finish time minus its own sync copies), since the link is shared and a later
    prefetch would delay layer l+1's sync copies. Off: no speculative copies; layer l+1
    fetches on demand (the greedy's sync copies) or runs on the CPU.
replacement (workload-aware, time correlation). Per layer the score of an expert is the
    tokens routed to it over the layer's last `horizon` forwards (a sliding window: expert
    activations are correlated in time over a few forwards, so the recent window predicts
    the next ones better than all of history, LFU, or the last use alone, LRU;
    docs/dali-and-gem.md). A copied expert enters the cache in place of the lowest-score
    resident this layer does not use on the GPU; with `gpu_limit=false` only if its own
    score is higher, otherwise it is copied to a one-use scratch buffer. Prefetches evict
    the lowest-score resident too. Off: LRU, as in mixtral_offload: the least recently
    used resident goes, and a copied expert is always cached while something can be evicted.

The initial residency is each layer's top-B experts by the calibration trace's popularity
(the workload profile; as static_split and fiddler place them), never experts 0..B-1.

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
from harness.model.hints import NEXT_GATE, RESIDUAL
from harness.placement.plan import LayerPlan
from harness.placement.system import PrepareContext, System
from systems.dali_assign import assign_layer, finish_time, scale_to_pairs
from systems.entry import SystemEntry
from systems.tide_tau import top_b_mask

ASSIGN_LOADS = ("predicted", "exact")
PREDICTORS = (RESIDUAL, NEXT_GATE)  # the hint channel its prediction reads (harness/model/hints.py)


@dataclass
class DaliConfig:
    name: str = "dali"
    assign: bool = True  # the greedy GPU/CPU assignment (false: resident on the GPU, the rest on the CPU, no copies)
    prefetch: bool = True  # copy the next layer's predicted-heaviest missing experts ahead, in the link's idle time
    replacement: bool = True  # evict the lowest time-correlation score (false: LRU)
    prefetch_k: int = 4  # prefetched experts per layer
    horizon: int = 8  # forwards the time-correlation score sums over (docs/dali-and-gem.md: an assumption)
    assign_loads: str = "predicted"  # predicted: from the previous layer's hint (the paper); exact: this forward's
    predictor: str = "residual"  # the hint channel: residual (the paper, as the harness reads it) | next_gate
    gpu_limit: bool = True  # at most B experts of a layer on the GPU, every copy cached (false: scratch copies)
    overlap: bool = True  # DALI runs the CPU and GPU sides concurrently; false charges them one after the other


def workload_horizon(config: DaliConfig) -> int:
    """The horizon of this run's time-correlation score (its replacement rule's), for the
    cache replay of DALI's measures."""
    return int(config.horizon)


class Dali(System):
    name = "dali"
    config_class = DaliConfig
    overlap = True
    needs_calibration = True  # the initial residency: the calibration's top-B

    def __init__(self, config: DaliConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        c = self.config
        assign, prefetch, replacement, prefetch_k = c.assign, c.prefetch, c.replacement, c.prefetch_k
        for key, value in (("assign", assign), ("prefetch", prefetch), ("replacement", replacement),
                           ("gpu_limit", c.gpu_limit)):
            if not isinstance(value, bool):
                raise HarnessError(f"system.{key} must be true or false (got {value!r})")
        for key, value in (("prefetch_k", prefetch_k), ("horizon", c.horizon)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise HarnessError(f"system.{key} must be a positive integer (got {value!r})")
        if c.assign_loads not in ASSIGN_LOADS:
            raise HarnessError(f"system.assign_loads must be one of {', '.join(ASSIGN_LOADS)} (got {c.assign_loads!r})")
        if c.predictor not in PREDICTORS:
            raise HarnessError(f"system.predictor must be one of {', '.join(PREDICTORS)} (got {c.predictor!r})")
        self.hint_channel = c.predictor
        self.assign, self.prefetch, self.replacement = assign, prefetch, replacement
        self.prefetch_k, self.horizon, self.gpu_limit = prefetch_k, c.horizon, c.gpu_limit
        self.predict_loads = assign and c.assign_loads == "predicted"
        self.wants_hint = prefetch or self.predict_loads
        self.popularity: torch.Tensor | None = None
        self.held = np.zeros((0, 0), bool)  # [L, E] mirror of the engine's residency (for layer + 1)
        self.score = np.zeros((0, 0))  # [L, E] tokens over the last `horizon` forwards of the layer
        self.window = np.zeros((0, 0, 0), np.int64)  # [L, horizon, E] those forwards' loads (a ring)
        self.seen = np.zeros(0, np.int64)  # [L] forwards the layer has planned
        self.predicted = np.zeros((0, 0))  # [L, E] the hint for the layer, from the layer before
        self.predicted_at = np.zeros(0, np.int64)  # [L] the forward that hint belongs to (-1: none)
        self.forward = 0
        self.last_use = np.zeros((0, 0))  # [L, E] tick of the last GPU use or arrival (LRU)
        self.tick = 0
        self.counts = {"gpu_experts": 0, "cpu_experts": 0, "cached": 0, "scratch": 0, "prefetched": 0,
                       "predicted_layers": 0}

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        self.capacity = ctx.experts_per_layer
        self.global_scope = ctx.budget_scope == "global"
        if ctx.calibration is None or len(ctx.calibration) == 0:
            raise HarnessError("system=dali needs a calibration trace for its initial residency (the workload profile)")
        self.popularity = ctx.calibration.loads.long().sum(0)  # [L, E]

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        """The workload profile's top-B experts per layer (budget.scope=global: the B x L most
        popular pairs); experts the calibration never routed fill the rest by id."""
        assert self.popularity is not None, "prepare() first"
        score = self.popularity * 2 + 1
        if self.global_scope:
            ranked = top_b_mask(score.flatten(), capacity * n_layers).reshape(score.shape)
        else:
            ranked = top_b_mask(score, capacity)
        initial = [set(torch.nonzero(row).flatten().tolist()) for row in ranked]
        self.capacity = capacity
        self.held = np.zeros((n_layers, n_experts), bool)
        for layer, experts in enumerate(initial):
            self.held[layer, list(experts)] = True
        self.total = capacity * n_layers  # under budget.scope=global
        self.score = np.zeros((n_layers, n_experts))
        self.window = np.zeros((n_layers, self.horizon, n_experts), np.int64)
        self.seen = np.zeros(n_layers, np.int64)
        self.predicted = np.zeros((n_layers, n_experts))
        self.predicted_at = np.full(n_layers, -1, np.int64)
        # recency in id order, expert 0 least recent (as mixtral_offload)
        self.last_use = np.tile(np.arange(n_experts, dtype=np.float64), (n_layers, 1)) - n_experts
        return initial

    def on_step(self, step: Any) -> None:
        self.forward += 1

    def _update_score(self, layer: int, loads: np.ndarray) -> None:
        """The time-correlation score: this forward's loads enter the window, the oldest leave."""
        slot = int(self.seen[layer] % self.horizon)
        self.score[layer] += loads - self.window[layer, slot]
        self.window[layer, slot] = loads
        self.seen[layer] += 1

    def _cap(self) -> int | None:
        """How many of a layer's experts the GPU may compute: B (budget.scope=global: the
        whole budget, room made in other layers); None without the limit."""
        if not self.gpu_limit:
            return None
        return self.total if self.global_scope else self.capacity

    def _assign(self, layer: int, loads: np.ndarray, held: np.ndarray) -> np.ndarray:
        """The GPU side of the assignment (module docstring: assign)."""
        cap = self._cap()
        on_gpu = np.zeros(loads.shape[0], bool)
        predicted = self.predicted_loads(layer, loads) if self.predict_loads else None
        if predicted is None:
            assign_layer(loads, held, self.ctx.cost, on_gpu, cap)
            return on_gpu
        self.counts["predicted_layers"] += 1
        assign_layer(predicted, held, self.ctx.cost, on_gpu, cap)
        routed = loads > 0
        on_gpu = routed & (on_gpu | (held & (predicted == 0)))
        if cap is not None and np.count_nonzero(on_gpu) > cap:
            copies = np.flatnonzero(on_gpu & ~held)
            drop = copies[np.argsort(predicted[copies], kind="stable")][: np.count_nonzero(on_gpu) - cap]
            on_gpu[drop] = False
        return on_gpu

    def predicted_loads(self, layer: int, loads: np.ndarray) -> np.ndarray | None:
        """int64 [E]: the hint handed for this layer in this forward, scaled to the forward's
        routed pairs and rounded by largest remainders (ties to the lower id); None without
        one (layer 0, a forward without hints)."""
        if self.predicted_at[layer] != self.forward:
            return None
        return scale_to_pairs(self.predicted[layer], int(loads.sum()))

    # ---- one layer -----------------------------------------------------------------
    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        self.tick += 1
        self.held[layer] = resident  # the engine's residency is the truth
        loads, held = load, resident
        self._update_score(layer, loads.astype(np.int64))
        if hint is not None and layer + 1 < self.held.shape[0]:
            self.predicted[layer + 1] = hint.double().numpy()
            self.predicted_at[layer + 1] = self.forward
        routed = loads > 0
        finish = None  # the layer's Phi, for the prefetch's room
        on_gpu = self._assign(layer, loads, held) if self.assign else routed & held
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
            strict = self.replacement and not self.gpu_limit  # under the limit a GPU expert is always cached
            n_cached, n_scratch = admit_layer(on_gpu, self.held[layer], self.score[layer], key, self.capacity,
                                              strict, moves)
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
            elif victims and (not self.replacement or self.gpu_limit or self.score[layer, e] > key[victims[0]]):
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
            "assign_loads": "predicted" if self.predict_loads else "exact",
            "gpu_limit": self.gpu_limit,
            "horizon": self.horizon,
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
    # each of its three parts switched off, other prefetch and horizon settings, exact loads, no memory limit
    invariant_options=({}, {"assign": False}, {"prefetch": False}, {"replacement": False},
                       {"prefetch_k": 2, "horizon": 1}, {"assign_loads": "exact"}, {"gpu_limit": False},
                       {"predictor": "next_gate"}),
    measure_horizon=workload_horizon,
    golden_variants={"+next_gate": ("system.predictor=next_gate",)},
    about="DALI-style workload-aware offloading: greedy GPU/CPU assignment under the memory limit, prefetch, "
          "time-correlation replacement.",
)
