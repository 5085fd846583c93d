"""The interface every expert-placement policy implements.

A system sees only loads (tokens routed to each expert of one MoE layer at one forward)
and answers with a `LayerPlan`. It never touches weights: the engine owns residency,
checks every plan and executes it, so every system runs unchanged live and in replay.

Layer indices are MoE-layer indices: 0 .. n_moe_layers-1 (the dense first layer is not
counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from harness.core.topology import SINGLE, Topology
from harness.decode.decoding import ForwardKind, StepInfo  # noqa: F401 - re-exported for systems

if TYPE_CHECKING:
    from harness.core.cost import CostModel
    from harness.core.ledger import LayerOutcomes
    from harness.model.config import LLaDA2Config
    from harness.traces.trace import RoutingTrace

@dataclass(slots=True)
class LayerPlan:
    """Where each routed expert of one layer is computed, and which weights move.

    gpu / cpu: numpy bool [E]; every routed expert (load > 0) is set in exactly one of
    them. (numpy, not torch: the plan sits between the router and the experts of every
    layer, and a torch op costs several microseconds there; see harness/core/plan_rules.py.)
    fetch_sync: copied host->GPU before the layer computes (blocking); these become
    resident unless also listed in `scratch`.
    fetch_async: copied in the background (prefetch / async migration); they become
    resident for later use, the current layer does not wait for them.
    scratch: subset of fetch_sync copied to a one-use buffer and never cached (Fiddler).
    evict: resident experts dropped before this plan's fetches land.
    prefetch / prefetch_evict: copied asynchronously into (dropped from) the NEXT layer's
    cache. They are issued when this layer plans (the hint about layer+1 exists then) and
    share the PCIe link; layer+1's GPU experts wait only for the ones they use.
    device: with topology=multi only (expert parallelism), int [E]: the GPU that computes
    each expert; the engine charges the layer as its slowest GPU (harness/core/topology.py).
    evict_elsewhere: (layer, expert) pairs of OTHER layers dropped before this plan's
    fetches land, so that a layer can make room in another's cache under
    budget.scope=global (DALI); dropping weights costs nothing.
    free_moves: the plan's residency moves cost nothing and land before the layer computes
    (the oracle's hindsight bound): its cached sync fetches are counted as free copies, not
    charged, and a miss is a routed expert not resident after the moves.

    Each of the six id fields holds expert ids (a sequence or an int array) or a numpy
    bool mask [E] of them (ids in ascending order): a system that has the mask already
    saves the conversion both ways, and the engine checks a mask in a few array operations
    (`move_count` counts either form). The id fields default to empty tuples (a plan is
    built every layer of every forward): a system that extends one after construction
    passes its own list.
    """

    gpu: np.ndarray
    cpu: np.ndarray
    fetch_sync: Sequence[int] = ()
    fetch_async: Sequence[int] = ()
    scratch: Sequence[int] = ()
    evict: Sequence[int] = ()
    prefetch: Sequence[int] = ()
    prefetch_evict: Sequence[int] = ()
    evict_elsewhere: Sequence[tuple[int, int]] = ()
    device: torch.Tensor | None = None
    free_moves: bool = False

    def with_lists(self) -> LayerPlan:
        """This plan with each id field as a list of Python ints (for code that iterates them)."""
        return replace(self, **{name: move_ids(getattr(self, name)).tolist() for name in ID_LISTS})


ID_LISTS = ("fetch_sync", "fetch_async", "scratch", "evict", "prefetch", "prefetch_evict")


def _is_mask(items: Sequence[int] | np.ndarray) -> bool:
    return isinstance(items, np.ndarray) and items.dtype == np.bool_


def move_ids(items: Sequence[int] | np.ndarray) -> np.ndarray:
    """A plan's id field as int64 ids (a mask's in ascending order)."""
    return np.flatnonzero(items) if _is_mask(items) else np.asarray(items, dtype=np.int64).reshape(-1)


def move_count(items: Sequence[int] | np.ndarray) -> int:
    """How many experts a plan's id field names (ids or a bool mask)."""
    return int(np.count_nonzero(items)) if _is_mask(items) else len(items)


@dataclass
class PrepareContext:
    """What a system may use for its offline work in `prepare()`."""

    geometry: LLaDA2Config  # nominal geometry (what the cost model charges)
    experts_per_layer: int  # B
    cost: CostModel
    calibration: RoutingTrace | None  # gpu_only routing of the calibration prompts
    decode_steps: int | None = None  # denoising steps per block of the run (T)
    topology: Topology = SINGLE  # the GPUs (relative speeds) an expert-parallel system maps onto
    budget_scope: str = "per_layer"  # global: B x layers experts in total, any split (harness/core/budget.py)


class BatchPlanner(Protocol):
    """What a system decides for n forwards x every MoE layer at once (a replay)."""

    def plan(self, loads: np.ndarray, steps: list[StepInfo]) -> LayerOutcomes:
        """loads: int64 [n, L, E]; runs the system's per-forward work (`on_step`) too."""
        ...

    def residency(self) -> np.ndarray:
        """bool [L, E]: what the GPU holds after the forwards planned so far."""
        ...


class System:
    """Base class. Subclasses set `name`, `overlap`, and implement `plan`."""

    name: str = "base"
    overlap: bool = False  # CPU experts run concurrently with GPU experts
    max_loads_in_flight: int = 0  # > 0: misses load while resident experts compute (harness/core/pipeline.py)
    wants_hint: bool = False  # ask the engine for next-layer predicted loads
    needs_calibration: bool = False
    ignores_budget: bool = False  # gpu_only: the engine sizes residency to E, not B
    multi_gpu: bool = False  # expert parallelism: runs only with topology=multi, sets plan.device

    def __init__(self, **options: object) -> None:
        self.options = options

    def prepare(self, ctx: PrepareContext) -> None:
        self.ctx = ctx

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        """What the GPU holds before the first forward (called after `prepare`).
        Default: experts 0..B-1 of every layer."""
        return [set(range(min(capacity, n_experts))) for _ in range(n_layers)]

    def on_step(self, step: StepInfo) -> None:
        pass

    def plan(self, layer: int, load: np.ndarray, hint: torch.Tensor | None,
             resident: np.ndarray) -> LayerPlan:
        """One MoE layer of one forward: `load` is the int64 [E] count of tokens routed to
        each expert (never negative), `hint` the next layer's predicted load (a float [E]
        tensor, only for systems with `wants_hint`), `resident` the experts this layer
        holds now (bool [E], read-only: a view of the engine's residency, which the engine
        changes once the plan is applied; copy it to keep it). Leave `load` as it is."""
        raise NotImplementedError

    def report(self) -> dict[str, object]:
        """System-specific figures for result.json (tau*, d, Lat(tau) curve, ...)."""
        return {}
