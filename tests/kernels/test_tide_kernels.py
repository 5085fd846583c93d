"""systems/tide.py: the compiled refresh (`refresh_layer`, `refreshed`) and top-B
(`top_b_row`, `_top_b_rows`) against TIDE's rule as the tau solver states it
(`refresh_residency`, `top_b_mask`) and a stable argsort; and the batch planner's packed
refresh (`refresh_bits`) against the same rule."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.accounting.bitsets import pack, unpack
from systems.tide import _top_b_rows, refresh_bits, refresh_layer, refreshed, top_b, top_b_row
from systems.tide_tau import refresh_residency, top_b_mask
from tests.kernels.support import KERNEL, loads, same_bits, sizes


def top_b_row_reference(loads: np.ndarray, capacity: int) -> np.ndarray:
    """Test-only reference: the first `capacity` routed experts (load > 0) of a stable
    argsort by descending load (ties to the lower id)."""
    order = np.argsort(-loads, kind="stable")
    target = np.zeros(loads.shape[0], bool)
    target[order[:capacity]] = True
    return target & (loads > 0)


def refresh_layer_reference(now: np.ndarray, loads: np.ndarray, capacity: int, sync: bool
                            ) -> tuple[np.ndarray, int]:
    """Test-only reference: masks [4, E] (gpu, cpu, promoted, demoted) of a refresh, from
    `refresh_residency`: the routed experts serve on the GPU if resident after the refresh
    (sync) or before and after it (async), else on the CPU; and how many are promoted."""
    after = refresh_residency(torch.from_numpy(now), torch.from_numpy(loads), capacity).numpy()
    routed, serving = loads > 0, after if sync else now & after
    promote, demote = after & ~now, now & ~after
    return np.stack([routed & serving, routed & ~serving, promote, demote]), int(promote.sum())


def resident_of(data: st.DataObject, n: int, capacity: int) -> np.ndarray:
    """At most `capacity` resident experts (the engine's invariant)."""
    resident = np.zeros(n, bool)
    resident[data.draw(st.permutations(range(n)))[: data.draw(st.integers(0, min(capacity, n)))]] = True
    return resident


@KERNEL
@given(st.data())
def test_one_layers_refresh_is_the_tau_solvers_rule(data: st.DataObject) -> None:
    n = data.draw(sizes(0, 40))
    loads_ = data.draw(loads(n, top=data.draw(st.sampled_from([1, 3, 30]))))
    capacity = data.draw(st.integers(0, n + 1))
    now, sync = resident_of(data, n, capacity), data.draw(st.booleans())
    want_masks, want_promoted = refresh_layer_reference(now, loads_, capacity, sync)
    assert same_bits(refreshed(now, loads_, capacity), want_masks[0] | want_masks[2] | (now & ~want_masks[3]))
    got_masks = np.ones((4, n), bool)  # garbage: the kernel writes every entry
    assert refresh_layer(now, loads_, capacity, sync, got_masks) == want_promoted
    assert same_bits(got_masks, want_masks)


@KERNEL
@given(st.data())
def test_top_b_is_the_stable_argsort(data: st.DataObject) -> None:
    rows, n = data.draw(st.integers(0, 5)), data.draw(sizes(0, 40))
    block = np.stack([data.draw(loads(n, top=data.draw(st.sampled_from([1, 3, 30])))) for _ in range(rows)]) \
        if rows else np.zeros((0, n), np.int64)
    capacity = data.draw(st.integers(0, n + 1))
    want = np.array([top_b_row_reference(row, capacity) for row in block]).reshape(rows, n)
    for row, expected in zip(block, want, strict=True):
        assert same_bits(top_b_row(row, capacity), expected)
    assert same_bits(_top_b_rows(block, capacity), want)
    if n:  # (the wrapper's reshape needs experts: a model has some)
        assert same_bits(top_b(block, capacity), want)
    assert same_bits(top_b_mask(torch.from_numpy(block), capacity).numpy(), want)  # the solver's rule


def test_top_b_and_refresh_bits_agree_with_tau_solver() -> None:
    rng = np.random.default_rng(0)
    n_experts, partial_rows = 70, 0  # not a multiple of 64: packing pads
    for trial in range(300):
        capacity = int(rng.choice([0, 1, 5, 20, 40, 69, 70]))
        load = rng.integers(0, int(rng.choice([2, 4, 30])), size=(6, n_experts))  # many ties
        resident = np.zeros((6, n_experts), bool)
        for row in resident:
            row[rng.permutation(n_experts)[: rng.integers(0, capacity + 1)]] = True
        target = top_b(load, capacity)
        assert np.array_equal(target, top_b_mask(torch.from_numpy(load), capacity).numpy()), trial
        packed_target = pack(target)
        after = refresh_bits(pack(resident), packed_target, target.sum(-1), capacity, n_experts)
        expected = refresh_residency(torch.from_numpy(resident), torch.from_numpy(load), capacity).numpy()
        assert np.array_equal(unpack(after, n_experts), expected), trial
        one_row = [refreshed(resident[r], load[r], capacity) for r in range(len(load))]  # the live plan's twin
        assert np.array_equal(np.stack(one_row), expected), trial
        n_demote = (target & ~resident).sum(-1) - (capacity - resident.sum(-1))
        partial_rows += int(((n_demote > 0) & (target.sum(-1) < capacity)).sum())
    assert partial_rows > 20  # the partial-demotion path ran, not only the two shortcuts
