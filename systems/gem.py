"""GEM-style GPU-variability-aware expert-to-GPU mapping (docs/systems.md).

topology=multi only: experts are spread over G GPUs of unequal speed and nothing is
offloaded; a layer finishes when its slowest GPU does (harness/accounting/topology.py). Like
ep_linear, each GPU holds a fixed number of experts per layer (the same E / G split, so
both use the same memory); GEM chooses *which* experts, per layer, once, in prepare():

1. Latency curves. For every GPU r the latency of one expert against its token count,
   sampled from the cost model's grouped-GEMM times at tile boundaries (n = 0, tile,
   2 tile, ...) and scaled by the GPU's relative speed; n tokens cost what the next
   boundary costs (a GEMM pads its rows to the tile). The tile defaults to the hardware
   profile's `gpu_gemm_tile` (64), where the curve is the cost model itself.
2. The profiling window: `calibration_steps` (16) forwards. `window=online` (the default,
   as the paper profiles): the served workload's own first 16 decode or denoise forwards,
   served with ep_linear's mapping while GEM observes their loads; at the next forward GEM
   searches and switches to its own mapping (the move of expert weights between GPUs is not
   charged). The profiling forwards' time is thus charged at ep_linear's speed, the cost of
   profiling online; a run shorter than the window stays on ep_linear's mapping.
   `window=calibration`: 16 denoise forwards of the calibration trace, evenly spaced over
   it, searched before the first forward.
3. The objective, per layer: sum over the window's steps of the slowest GPU's latency,
   GPU r's latency being the sum of its routed experts' curve values.
4. Search, per layer: `starts` greedy starting maps (experts heaviest first, weights
   perturbed by multiplicative noise except in the first; each goes to the GPU with a free
   slot that keeps the objective lowest) plus the ep_linear map; each is improved by
   pairwise swaps of experts on different GPUs (the best swap for one expert at a time,
   taken when it strictly lowers the objective) until no swap helps; the best map wins.
   Because ep_linear's map is one of the starts and swaps only lower the objective, GEM's
   map never scores worse than ep_linear's on the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.common.errors import HarnessError
from harness.placement.plan import LayerPlan
from harness.placement.system import PrepareContext, System
from harness.placement.trace import RoutingTrace
from systems.entry import SystemEntry
from systems.ep_linear import expert_parallel_plan, linear_mapping


@dataclass
class GemConfig:
    name: str = "gem"
    calibration_steps: int = 16  # denoise forwards of the calibration trace in the window (evenly spaced)
    tile: int = 0  # token-count tile at whose boundaries the latency curves are sampled; 0: hardware.gpu_gemm_tile
    starts: int = 4  # noisy greedy starting maps (plus ep_linear's), each improved by pairwise swaps
    noise: float = 0.2  # relative noise on expert weights in the noisy starts
    seed: int = 0  # of the noisy starts
    window: str = "online"  # online: the served workload's first forwards; calibration: the calibration trace


WINDOWS = ("online", "calibration")


def calibration_window(trace: RoutingTrace | None, n_steps: int) -> torch.Tensor:
    """Loads [S, L, E] of n_steps denoise forwards spread evenly over the trace."""
    rows = [i for i, s in enumerate(trace.steps) if s.in_block] if trace is not None else []
    if not rows:
        raise HarnessError("system=gem needs a calibration trace with denoise steps (calibration.prompts)")
    picks = torch.linspace(0, len(rows) - 1, min(n_steps, len(rows))).round().long().unique()
    return trace.loads[[rows[int(i)] for i in picks]].long()


def latency_tables(cost: Any, speeds: tuple[float, ...], max_tokens: int, tile: int) -> torch.Tensor:
    """float64 [G, K+1]: GPU r's latency of one expert with k * tile tokens."""
    boundaries = torch.arange(0, -(-max(max_tokens, 1) // tile) + 1) * tile
    base = cost.grouped_gpu_expert_times(boundaries)
    return base[None, :] / torch.tensor(speeds, dtype=torch.float64)[:, None]


def profiling_cost(cost: Any, speeds: tuple[float, ...], max_tokens: int, tile: int) -> dict[str, float]:
    """GEM's profiling at tile boundaries against a dense profile (every token count
    0..max_tokens), over every GPU's curve: the latency samples each needs, and the relative
    error of the boundary curve (n tokens charged as the next boundary) against the cost
    model at n = 1..max_tokens (mean and largest; the same on every GPU, whose speed scales
    both curves)."""
    top = max(max_tokens, 1)
    boundaries = latency_tables(cost, speeds, top, tile)  # [G, K+1]
    counts = torch.arange(0, top + 1)
    dense = cost.grouped_gpu_expert_times(counts)[None, :] / torch.tensor(speeds, dtype=torch.float64)[:, None]
    charged = boundaries[:, -(-counts[1:] // tile)]
    error = (charged - dense[:, 1:]).abs() / dense[:, 1:]
    return {"gem_profile_samples": float(boundaries.numel()), "gem_dense_profile_samples": float(dense.numel()),
            "gem_profile_error_mean": float(error.mean()), "gem_profile_error_max": float(error.max())}


def expert_costs(loads: torch.Tensor, tables: torch.Tensor, tile: int) -> torch.Tensor:
    """float64 [G, S, E]: each GPU's curve value for each (step, expert) of one layer."""
    tiles = -(-loads // tile)  # n tokens cost the next tile boundary; 0 tokens cost 0
    return tables[:, tiles]


def mapping_score(costs: torch.Tensor, mapping: torch.Tensor) -> float:
    """Sum over steps of the slowest GPU's latency under `mapping` [E]."""
    return float(gpu_busy(costs, mapping).max(-1).values.sum())


def gpu_busy(costs: torch.Tensor, mapping: torch.Tensor) -> torch.Tensor:
    """[S, G]: each GPU's latency per step under `mapping`."""
    n_gpus, n_steps, _ = costs.shape
    own = costs.gather(0, mapping.expand(n_steps, -1).unsqueeze(0)).squeeze(0)  # [S, E]
    return torch.zeros(n_steps, n_gpus, dtype=torch.float64).index_add_(1, mapping, own)


def greedy_map(costs: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Experts by descending weight, each to the GPU with a free slot that keeps the
    objective (sum over steps of the slowest GPU) lowest; ties to the lower GPU id."""
    n_gpus, n_steps, n_experts = costs.shape
    busy = torch.zeros(n_steps, n_gpus, dtype=torch.float64)
    free = slots.clone()
    mapping = torch.empty(n_experts, dtype=torch.long)
    eye = torch.eye(n_gpus, dtype=torch.float64)
    for e in torch.sort(weights, descending=True, stable=True).indices.tolist():
        trial = busy[None] + costs[:, :, e, None] * eye[:, None, :]  # [G (choice), S, G]
        score = trial.max(-1).values.sum(-1)
        score[free == 0] = float("inf")
        r = int(score.argmin())
        mapping[e], free[r] = r, free[r] - 1
        busy[:, r] += costs[r, :, e]
    return mapping


PAIR_LOOP_MAX_GPUS = 4  # up to here GPU pair by pair is faster; above, all swaps at once (3-8x at 16 GPUs)


def best_swap(costs: torch.Tensor, mapping: torch.Tensor, busy: torch.Tensor) -> tuple[float, int, int]:
    """(objective after, e, f) of the swap of two experts e, f on GPUs a = g(e) < b = g(f)
    that lowers the objective most (e = f = -1 if there is no such pair); ties go to the
    smallest (a, b, e, f). A swap changes only GPUs a and b; the others' slowest latency
    (the pair's floor) stays. Two evaluation orders, equal bit for bit
    (tests/kernels/test_gem_swaps.py), each the faster for its GPU count."""
    if costs.shape[0] <= PAIR_LOOP_MAX_GPUS:
        return best_swap_by_pairs(costs, mapping, busy)
    return best_swap_all_pairs(costs, mapping, busy)


def best_swap_by_pairs(costs: torch.Tensor, mapping: torch.Tensor, busy: torch.Tensor) -> tuple[float, int, int]:
    """best_swap GPU pair by pair (a < b), all of one pair's swaps at once; a later pair
    replaces the best only if strictly lower."""
    n_gpus = costs.shape[0]
    best = (float("inf"), -1, -1)
    for a in range(n_gpus):
        on_a = torch.nonzero(mapping == a).flatten()
        for b in range(a + 1, n_gpus):
            on_b = torch.nonzero(mapping == b).flatten()
            if not len(on_a) or not len(on_b):
                continue
            rest = [g for g in range(n_gpus) if g not in (a, b)]
            floor = busy[:, rest].max(-1).values if rest else torch.zeros(busy.shape[0], dtype=busy.dtype)
            # [|A|, |B|, S]: GPU a gives up e (row) and takes f (column); GPU b the reverse
            new_a = busy[:, a] - costs[a][:, on_a].T[:, None, :] + costs[a][:, on_b].T[None, :, :]
            new_b = busy[:, b] - costs[b][:, on_b].T[None, :, :] + costs[b][:, on_a].T[:, None, :]
            scores = step_sum(torch.maximum(torch.maximum(new_a, new_b), floor))
            at = int(scores.argmin())
            i, j = divmod(at, scores.shape[1])
            if float(scores[i, j]) < best[0]:
                best = (float(scores[i, j]), int(on_a[i]), int(on_b[j]))
    return best


def best_swap_all_pairs(costs: torch.Tensor, mapping: torch.Tensor, busy: torch.Tensor) -> tuple[float, int, int]:
    """best_swap over every expert pair at once, one [E, E] step slab at a time."""
    n_gpus, n_steps, n_experts = costs.shape
    by_step = costs.permute(1, 0, 2).contiguous()  # [S, G, E]
    floors = _floors(busy).permute(2, 1, 0).contiguous()  # [S, b, a]
    ids = torch.arange(n_experts)
    scores = torch.empty(0)
    for step in range(n_steps):  # one [E, E] slab at a time: summed left to right, and it stays in cache
        on = by_step[step].index_select(0, mapping)  # [e, f]: f's cost on e's GPU
        own_rest = busy[step].index_select(0, mapping) - on[ids, ids]  # [e]: e's GPU without e
        new_a = own_rest[:, None] + on  # g(e) gives up e, takes f
        new_b = new_a.T.contiguous()  # g(f) gives up f, takes e: [e, f] is new_a's [f, e]
        # [e, f]: floor of the pair (g(e), g(f)), by row selections (far cheaper than a 2-D gather)
        floor = floors[step].index_select(0, mapping).T.contiguous().index_select(0, mapping)
        score = torch.maximum(torch.maximum(new_a, new_b), floor)
        scores = score if step == 0 else scores.add_(score)
    valid = mapping[:, None] < mapping[None, :]
    if not bool(valid.any()):
        return (float("inf"), -1, -1)
    scores = scores.masked_fill(~valid, float("inf"))
    tied = torch.nonzero(scores == scores.min())  # [k, 2]: (e, f), e ascending then f
    order = mapping[tied[:, 0]] * n_gpus + mapping[tied[:, 1]]  # (a, b) of each tie, lexicographic
    e, f = tied[int(torch.argmin(order))].tolist()  # argmin takes the first: smallest (e, f) of that (a, b)
    return (float(scores[e, f]), e, f)


def step_sum(x: torch.Tensor) -> torch.Tensor:
    """x summed over its last (step) dim left to right, as best_swap sums a swap's score.
    (torch's sum picks its order by the tensor's shape, and a score must not depend on how
    many swaps are scored at once.)"""
    total = x[..., 0].clone()
    for s in range(1, x.shape[-1]):
        total += x[..., s]
    return total


def _floors(busy: torch.Tensor) -> torch.Tensor:
    """[G, G, S]: per step, the slowest latency among the GPUs other than a and b (0 if none)."""
    n_gpus = busy.shape[1]
    eye = torch.eye(n_gpus, dtype=torch.bool)
    left_out = eye[:, None, :] | eye[None, :, :]  # [a, b, g]: g is a or b
    others = busy.T[None, None].expand(n_gpus, n_gpus, -1, -1).masked_fill(left_out[..., None], float("-inf"))
    if n_gpus <= 2:
        return torch.zeros(n_gpus, n_gpus, busy.shape[0], dtype=busy.dtype)
    return others.max(2).values  # [a, b, S]


def improve_by_swaps(costs: torch.Tensor, mapping: torch.Tensor) -> torch.Tensor:
    """Apply the best pairwise swap while it strictly lowers the objective."""
    mapping = mapping.clone()
    score = mapping_score(costs, mapping)
    while True:
        after, e, f = best_swap(costs, mapping, gpu_busy(costs, mapping))
        if e < 0 or not after < score * (1 - 1e-12):
            return mapping
        mapping[e], mapping[f] = mapping[f].clone(), mapping[e].clone()
        score = after


class Gem(System):
    name = "gem"
    config_class = GemConfig
    overlap = False
    ignores_budget = True  # every expert resident (on some GPU): the budget B does not apply
    multi_gpu = True
    needs_calibration = True

    def __init__(self, config: GemConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        c = self.config
        calibration_steps, tile, starts, noise, seed = c.calibration_steps, c.tile, c.starts, c.noise, c.seed
        for key, value in (("calibration_steps", calibration_steps), ("starts", starts)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise HarnessError(f"system.{key} must be a positive integer (got {value!r})")
        if not isinstance(tile, int) or isinstance(tile, bool) or tile < 0:
            raise HarnessError(f"system.tile must be a positive integer or 0 (hardware.gpu_gemm_tile; got {tile!r})")
        if not 0 <= float(noise) <= 1:
            raise HarnessError(f"system.noise must be in [0, 1] (got {noise!r})")
        if c.window not in WINDOWS:
            raise HarnessError(f"system.window must be one of {', '.join(WINDOWS)} (got {c.window!r})")
        self.online = c.window == "online"
        self.needs_calibration = not self.online
        self.observed: list[np.ndarray] = []  # online: the window's loads, one [L, E] per forward
        self.row: np.ndarray | None = None  # the forward being observed
        self.profiling_forwards = 0
        self.calibration_steps, self.tile, self.starts = calibration_steps, tile, starts
        self.noise, self.seed = float(noise), seed
        self.mappings: torch.Tensor | None = None  # [L, E]
        self.scores: list[float] = []
        self.linear_scores: list[float] = []
        self.max_tokens = 0

    def prepare(self, ctx: PrepareContext) -> None:
        super().prepare(ctx)
        if self.config.tile == 0:  # the GPU's own grouped-GEMM tile
            self.tile = int(ctx.cost.hw.gpu_gemm_tile)  # type: ignore[attr-defined]
        # the search is thousands of small tensor ops: intra-op threads only add their
        # synchronisation (10-25x slower on a busy 2-core machine), so run it on one
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            if self.online:
                n_layers, n_experts = ctx.geometry.n_moe_layers, ctx.geometry.num_experts
                linear = linear_mapping(n_experts, len(ctx.topology.speeds))
                self.mappings = linear.expand(n_layers, -1).clone()
            else:
                self._map_layers(ctx, calibration_window(ctx.calibration, self.calibration_steps))
        finally:
            torch.set_num_threads(threads)

    def on_step(self, step: Any) -> None:
        """Online window: keep the forward just observed; once the window is full, search."""
        if not self.online or self.scores:
            return
        if self.row is not None:
            self.observed.append(self.row)
            self.row = None
        if len(self.observed) >= self.calibration_steps:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                self._map_layers(self.ctx, torch.from_numpy(np.stack(self.observed)).long())
            finally:
                torch.set_num_threads(threads)
            return
        if step.in_block:
            assert self.mappings is not None
            self.row = np.zeros(tuple(self.mappings.shape), np.int64)
            self.profiling_forwards += 1

    def _map_layers(self, ctx: PrepareContext, window: torch.Tensor) -> None:
        """Search every layer's mapping on the window's loads [S, L, E]."""
        n_experts, speeds = ctx.geometry.num_experts, ctx.topology.speeds
        linear = linear_mapping(n_experts, len(speeds))
        slots = torch.bincount(linear, minlength=len(speeds))
        self.max_tokens = int(window.max())  # the largest load of the window: the curves' range
        tables = latency_tables(ctx.cost, speeds, self.max_tokens, self.tile)
        gen = torch.Generator().manual_seed(self.seed)
        maps = []
        for layer in range(window.shape[1]):
            costs = expert_costs(window[:, layer], tables, self.tile)
            best = self.search_layer(costs, slots, linear, gen)
            maps.append(best)
            self.scores.append(mapping_score(costs, best))
            self.linear_scores.append(mapping_score(costs, linear))
        self.mappings = torch.stack(maps)

    def search_layer(
        self, costs: torch.Tensor, slots: torch.Tensor, linear: torch.Tensor, gen: torch.Generator
    ) -> torch.Tensor:
        weights = costs.mean(0).sum(0)  # an expert's latency over the window, averaged over GPUs
        starts = [linear]
        for i in range(self.starts):
            noise = 1 + self.noise * torch.randn(weights.shape, generator=gen, dtype=torch.float64)
            starts.append(greedy_map(costs, slots, weights * (noise if i else 1)))
        improved = [improve_by_swaps(costs, start) for start in starts]
        return min(improved, key=lambda m: mapping_score(costs, m))

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        return [set(range(n_experts)) for _ in range(n_layers)]

    def plan(
        self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray
    ) -> LayerPlan:
        assert self.mappings is not None, "prepare() first"
        if self.row is not None:
            self.row[layer] = load
        return expert_parallel_plan(load, self.mappings[layer])

    def profiling_cost(self) -> dict[str, float]:
        """`profiling_cost` of this run's curves (after prepare)."""
        return profiling_cost(self.ctx.cost, self.ctx.topology.speeds, self.max_tokens, self.tile)

    def report(self) -> dict[str, Any]:
        gem, linear = sum(self.scores), sum(self.linear_scores)
        return {
            "gpu_speeds": list(self.ctx.topology.speeds),
            "calibration_score_s": gem,  # objective over the window, all layers
            "ep_linear_calibration_score_s": linear,
            "calibration_gain": 1 - gem / linear if linear > 0 else 0.0,
            "gem_profiling_forwards": self.profiling_forwards if self.online else 0,
            "layer_scores_s": list(self.scores),
        }


ENTRY = SystemEntry(Gem, GemConfig, figures=Gem.profiling_cost,
                    about="GEM-style GPU-variability-aware expert-to-GPU mapping; needs topology=multi.")
