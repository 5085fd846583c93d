"""The compiled heaviest-first order and the oracle's held set against their numpy definitions."""

from __future__ import annotations

import numpy as np

from harness.accounting.counting_sort import heaviest_first
from systems.oracle import held_moves


def test_heaviest_first_is_the_stable_descending_argsort_of_the_routed_experts() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):
        loads = rng.integers(0, int(rng.integers(1, 12)), int(rng.integers(0, 40))).astype(np.int64)
        order = np.argsort(-loads, kind="stable")
        assert heaviest_first(loads).tolist() == order[loads[order] > 0].tolist()


def test_the_oracles_held_set_is_g_resident_first_then_g_then_the_rest_heaviest_first() -> None:
    rng = np.random.default_rng(1)
    for _ in range(1000):
        n = int(rng.integers(1, 30))
        loads = rng.integers(0, 6, n).astype(np.int64)
        gpu = (loads > 0) & (rng.random(n) < 0.5)
        resident = rng.random(n) < 0.4
        capacity = int(rng.integers(0, n + 1))
        masks = np.empty((4, n), bool)
        held_moves(loads, gpu, resident, capacity, masks)
        # the definition: stable sorts, heaviest first, then G's residents, G, the rest
        by_load = np.flatnonzero(loads)[np.argsort(-loads[loads > 0], kind="stable")]
        rank = np.where(gpu[by_load], np.where(resident[by_load], 0, 1), 2)
        held = np.zeros(n, bool)
        held[by_load[np.argsort(rank, kind="stable")[:capacity]]] = True
        assert masks[0].tolist() == ((loads > 0) & ~gpu).tolist()
        assert masks[2].tolist() == (gpu & ~held).tolist()
        assert masks[1].tolist() == ((held & ~resident) | (gpu & ~held)).tolist()
        assert masks[3].tolist() == (resident & ~held).tolist()
