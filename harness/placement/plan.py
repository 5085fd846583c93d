"""A system's answer for one MoE layer at one forward: the `LayerPlan`, and how its id fields
are read (ids or a bool mask)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch


@dataclass(slots=True)
class LayerPlan:
    """Where each routed expert of one layer is computed, and which weights move.

    gpu / cpu: numpy bool [E]; every routed expert (load > 0) is set in exactly one of
    them. (numpy, not torch: the plan sits between the router and the experts of every
    layer, and a torch op costs several microseconds there; see harness/engine/plan_rules.py.)
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
    each expert; the engine charges the layer as its slowest GPU (harness/accounting/topology.py).
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
