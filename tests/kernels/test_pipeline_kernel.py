"""harness/accounting/pipeline.py: one pipelined layer's timeline (Mixtral-Offload's bounded
loads in flight) against the rule written out as lists of copy and compute events."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from harness.accounting.pipeline import pipelined_layer
from tests.kernels.support import KERNEL, same_bits, seconds

TIMES = st.integers(0, 40).map(lambda k: k * 0.25) | st.floats(0.0, 1e3, allow_nan=False, allow_infinity=False)


def pipelined_layer_reference(hits_start: float, link_start: float, hit_s: float, miss_s: list[float],
                              copy_one: float, slots: int) -> tuple[float, float]:
    """Test-only reference: (end of the GPU experts, link free) of one layer. The hits run
    from `hits_start` for `hit_s`; the i-th miss's copy starts once the link is free (the
    previous copy ended, or at `link_start`) and a buffer is: at most `slots` copies in
    flight, a buffer freed when a loaded miss starts computing (miss i - slots); the miss
    computes once its copy ended and the GPU is free."""
    copy_end: list[float] = []
    compute_start: list[float] = []
    gpu_free = hits_start + hit_s
    for i, seconds_i in enumerate(miss_s):
        link_free = copy_end[i - 1] if i else link_start
        copy_start = link_free if i < slots else max(link_free, compute_start[i - slots])
        copy_end.append(copy_start + copy_one)
        compute_start.append(max(copy_end[i], gpu_free))
        gpu_free = compute_start[i] + seconds_i
    return gpu_free, copy_end[-1] if copy_end else link_start


@KERNEL
@given(hits_start=TIMES, link_start=TIMES, hit_s=TIMES, copy_one=TIMES, slots=st.integers(1, 6),
       miss_s=seconds(st.integers(0, 12)), unused=st.integers(0, 3))
def test_pipelined_layer_is_the_event_rule(hits_start: float, link_start: float, hit_s: float, copy_one: float,
                                           slots: int, miss_s: np.ndarray, unused: int) -> None:
    n_miss = len(miss_s)
    padded = np.concatenate([miss_s, np.full(unused, np.nan)])  # the kernel reads miss_s[:n_miss] only
    got = pipelined_layer(hits_start, link_start, hit_s, padded, n_miss, copy_one, slots)
    assert same_bits(got, pipelined_layer_reference(hits_start, link_start, hit_s, miss_s.tolist(), copy_one, slots))


def test_pipelined_layer_edge_cases() -> None:
    cases = [
        (0.0, 0.0, 5.0, [2.0, 2.0, 2.0], 3.0, 1),  # tests/unit/test_pipeline.py's hand-made layer
        (1.0, 4.0, 5.0, [], 3.0, 1),  # no misses: the link stays where it was
        (0.0, 7.0, 5.0, [2.0, 2.0], 3.0, 3),  # a busy link
        (0.0, 0.0, 0.0, [0.0] * 5, 0.0, 1),  # all zero
        (0.0, 0.0, 1.0, [1.0] * 8, 1.0, 8),  # slots = misses
        (2.0, 0.0, 0.0, [4.0, 0.0, 4.0, 0.0], 1.0, 2),
    ]
    for hits_start, link_start, hit_s, miss_s, copy_one, slots in cases:
        got = pipelined_layer(hits_start, link_start, hit_s, np.array(miss_s, np.float64), len(miss_s), copy_one, slots)
        assert same_bits(got, pipelined_layer_reference(hits_start, link_start, hit_s, miss_s, copy_one, slots))
