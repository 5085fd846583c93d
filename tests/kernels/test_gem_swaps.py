"""systems/gem.py: best_swap's two evaluation orders, every expert pair at once and GPU pair
by GPU pair (the rule as first written), bit for bit, ties included, and the swap search
that best_swap drives."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from systems.gem import PAIR_LOOP_MAX_GPUS, best_swap_all_pairs, best_swap_by_pairs, gpu_busy, improve_by_swaps


def _case(n_gpus: int, n_steps: int, n_experts: int, seed: int, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Costs on a coarse grid (`levels` values: many exact ties) and a random mapping."""
    gen = torch.Generator().manual_seed(seed)
    costs = torch.randint(0, levels, (n_gpus, n_steps, n_experts), generator=gen).double() * 0.125
    speeds = 1.0 + torch.rand(n_gpus, generator=gen, dtype=torch.float64)
    return costs / speeds[:, None, None], torch.randint(0, n_gpus, (n_experts,), generator=gen)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 24), st.integers(0, 10_000), st.sampled_from([2, 3, 50]))
def test_all_pairs_swap_is_the_pair_loop(n_gpus: int, n_steps: int, n_experts: int, seed: int, levels: int) -> None:
    costs, mapping = _case(n_gpus, n_steps, n_experts, seed, levels)
    busy = gpu_busy(costs, mapping)
    assert best_swap_all_pairs(costs, mapping, busy) == best_swap_by_pairs(costs, mapping, busy)


@pytest.mark.parametrize("n_gpus", [4, 8])  # either side of PAIR_LOOP_MAX_GPUS
def test_a_swap_search_ends_where_the_pair_loop_ends(n_gpus: int) -> None:
    costs, mapping = _case(n_gpus, 16, 64, 7, 1000)
    ours = improve_by_swaps(costs, mapping)
    other = best_swap_by_pairs if n_gpus > PAIR_LOOP_MAX_GPUS else best_swap_all_pairs  # not best_swap's choice
    theirs = mapping.clone()
    score = float(gpu_busy(costs, theirs).max(-1).values.sum())  # as improve_by_swaps starts
    while True:
        after, e, f = other(costs, theirs, gpu_busy(costs, theirs))
        if e < 0 or not after < score * (1 - 1e-12):
            break
        theirs[e], theirs[f] = theirs[f].clone(), theirs[e].clone()
        score = after
    assert torch.equal(ours, theirs)
