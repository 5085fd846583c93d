"""The per-layer cache updates, compiled: DALI's admission of copied experts
(systems/dali.py `admit_layer`) and Mixtral-Offload's LRU layer (systems/mixtral_offload.py
`lru_layer`), against their rules written in plain Python."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from systems.dali import admit_layer
from systems.mixtral_offload import lru_layer
from tests.kernels.support import KERNEL, loads, masks, same_bits, sizes


def admit_reference(on_gpu: np.ndarray, held: np.ndarray, score: np.ndarray, key: np.ndarray, capacity: int,
                    replacement: bool) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Test-only reference: the copies (on the GPU, not held) in order of descending score,
    ties to the lower id. Each takes a free slot while there is one (capacity - held), else
    the place of the next victim (held, not on the GPU this layer; lowest key first, ties to
    the lower id), with replacement only if its score is higher than the victim's; else it
    is a one-use scratch copy. Returns moves [3, E] (fetch_sync, scratch, evict), the held
    experts after, and (cached, scratch)."""
    n = held.shape[0]
    copies = sorted((e for e in range(n) if on_gpu[e] and not held[e]), key=lambda e: -score[e])
    victims = sorted((e for e in range(n) if held[e] and not on_gpu[e]), key=lambda e: key[e])
    free = capacity - sum(bool(h) for h in held)
    cached: list[int] = []
    scratch: list[int] = []
    evicted: list[int] = []
    for e in copies:
        if free > 0:
            free -= 1
            cached.append(e)
        elif len(evicted) < len(victims) and (not replacement or score[e] > score[victims[len(evicted)]]):
            evicted.append(victims[len(evicted)])
            cached.append(e)
        else:
            scratch.append(e)
    moves = np.zeros((3, n), bool)
    moves[0, copies], moves[1, scratch], moves[2, evicted] = True, True, True
    after = held.copy()
    after[evicted], after[cached] = False, True
    return moves, after, (len(cached), len(scratch))


def lru_reference(load: np.ndarray, held: np.ndarray, stamp: np.ndarray, clock: int, capacity: int
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """Test-only reference (systems/mixtral_offload.py's module docstring): every routed
    expert computes on the GPU; the misses are fetched in ascending id order into the room
    left once every unused expert could go (capacity - hits), the rest are scratch copies;
    as many unused held experts as the cached misses need go, least recent (lowest stamp)
    first; then every expert the layer used (routed, not scratch) is most recent, in
    ascending id order. Returns masks [4, E] (routed, missed, scratch, evicted), the
    stamps after and the next clock."""
    n = load.shape[0]
    routed = [e for e in range(n) if load[e] != 0]
    misses = [e for e in routed if not held[e]]
    room = max(0, capacity - (len(routed) - len(misses)))
    scratch = misses[room:]
    unused = sorted((e for e in range(n) if held[e] and load[e] == 0), key=lambda e: stamp[e])
    n_evict = max(0, sum(bool(h) for h in held) + len(misses) - len(scratch) - capacity)
    masks_ = np.zeros((4, n), bool)
    masks_[0, routed], masks_[1, misses], masks_[2, scratch], masks_[3, unused[:n_evict]] = True, True, True, True
    stamps = stamp.copy()
    for e in routed:
        if e not in scratch:
            stamps[e] = clock
            clock += 1
    return masks_, stamps, clock


def held_of(data: st.DataObject, n: int) -> tuple[np.ndarray, int]:
    """(held mask, capacity): at most `capacity` held (the engine's invariant), and a full
    cache half the time (where copies must evict or go to scratch)."""
    capacity = data.draw(st.integers(0, n))
    n_held = capacity if data.draw(st.booleans()) else data.draw(st.integers(0, capacity))
    held = np.zeros(n, bool)
    held[data.draw(st.permutations(range(n)))[:n_held]] = True
    return held, capacity


@KERNEL
@given(st.data())
def test_admit_layer_is_the_admission_rule(data: st.DataObject) -> None:
    n = data.draw(sizes(0, 24))
    held, capacity = held_of(data, n)
    on_gpu = data.draw(masks(n))
    coarse = st.integers(0, 6).map(float)  # many ties
    values = coarse if data.draw(st.booleans()) else coarse | st.floats(0, 100)
    score = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), np.float64)
    replacement = data.draw(st.booleans())
    key = score if replacement else np.array(data.draw(st.lists(coarse, min_size=n, max_size=n)), np.float64)
    moves, after = np.zeros((3, n), bool), held.copy()  # the policy hands the kernel zeroed moves
    counts = admit_layer(on_gpu, after, score, key, capacity, replacement, moves)
    want_moves, want_after, want_counts = admit_reference(on_gpu, held, score, key, capacity, replacement)
    assert tuple(int(c) for c in counts) == want_counts
    assert same_bits(moves, want_moves) and same_bits(after, want_after)


@KERNEL
@given(st.data())
def test_lru_layer_is_the_lru_rule(data: st.DataObject) -> None:
    n = data.draw(sizes(0, 24))
    held, capacity = held_of(data, n)
    load = data.draw(loads(n, top=4))
    stamp = np.array(data.draw(st.permutations(range(n))), np.int64)  # recency stamps are distinct
    clock = n + data.draw(st.integers(0, 50))
    got_masks, got_stamp = np.ones((4, n), bool), stamp.copy()  # garbage masks: the kernel writes them all
    got_clock = lru_layer(load, held, got_stamp, clock, capacity, got_masks)
    want_masks, want_stamp, want_clock = lru_reference(load, held, stamp, clock, capacity)
    assert int(got_clock) == want_clock
    assert same_bits(got_masks, want_masks) and same_bits(got_stamp, want_stamp)
