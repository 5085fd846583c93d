"""harness/engine/plan_rules.py: `layer_rules`, the per-expert pass over a plan's masks,
against each rule of LAYER_RULES written as a numpy mask."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from harness.engine.plan_rules import LAYER_RULES, layer_rules
from tests.kernels.support import KERNEL, loads, masks, same_bits, sizes


def layer_rules_reference(loads: np.ndarray, gpu: np.ndarray, cpu: np.ndarray, held: np.ndarray, sync: np.ndarray,
                          in_async: np.ndarray, scratch: np.ndarray, evict: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int, int]]:
    """Test-only reference: per expert the bits of the rules it breaks (bit i: LAYER_RULES[i]),
    the routed experts not held (missed) and the sync fetches that stay (not scratch); and
    (the bits any expert breaks, sync fetches, scratch copies, evictions)."""
    routed, computed = loads != 0, gpu | cpu
    rules = {
        "computed-twice": gpu & cpu,
        "routed-not-computed": routed & ~computed,
        "unrouted-computed": computed & ~routed,
        "evict-not-resident": evict & ~held,
        "fetch-resident": ((sync | in_async) & held) | (sync & in_async),
        "scratch-not-sync": scratch & ~sync,
        "scratch-not-gpu": scratch & ~gpu,
        "evicted-computed-on-gpu": evict & gpu,
        "gpu-not-resident": gpu & ~(held | sync),
    }
    assert list(rules) == [rule for rule, _ in LAYER_RULES]
    broken = np.zeros(loads.shape[0], np.int64)
    for bit, mask in enumerate(rules.values()):
        broken |= mask.astype(np.int64) << bit
    any_broken = int(np.bitwise_or.reduce(broken)) if broken.size else 0
    counts = (any_broken, int(sync.sum()), int(scratch.sum()), int(evict.sum()))
    return broken, routed & ~held, sync & ~scratch, counts


def check(loads_: np.ndarray, fields: list[np.ndarray]) -> None:
    n = loads_.shape[0]
    # the outputs start as garbage: the kernel writes every entry
    missed, cached, broken = np.ones(n, bool), np.ones(n, bool), np.full(n, -1, np.int32)
    counts = layer_rules(loads_, *fields, missed, cached, broken)
    want_broken, want_missed, want_cached, want_counts = layer_rules_reference(loads_, *fields)
    assert tuple(int(c) for c in counts) == want_counts
    assert same_bits(broken, want_broken) and same_bits(missed, want_missed) and same_bits(cached, want_cached)


@KERNEL
@given(st.data())
def test_layer_rules_are_the_numpy_masks(data: st.DataObject) -> None:
    """Any masks: every combination of the seven fields breaks some rules or none."""
    n = data.draw(sizes(0, 24))
    check(data.draw(loads(n)), [data.draw(masks(n)) for _ in range(7)])


@KERNEL
@given(st.data())
def test_layer_rules_on_mostly_valid_plans(data: st.DataObject) -> None:
    """Plans built to keep the rules, then a few entries flipped: the single broken rules."""
    n = data.draw(sizes(1, 24))
    loads_, held, on_gpu = data.draw(loads(n)), data.draw(masks(n)), data.draw(masks(n))
    routed = loads_ != 0
    gpu, cpu = routed & on_gpu, routed & ~on_gpu
    sync = gpu & ~held
    scratch = sync & data.draw(masks(n))
    evict = held & ~gpu & data.draw(masks(n))
    in_async = ~held & ~sync & data.draw(masks(n))
    fields = [gpu, cpu, held, sync, in_async, scratch, evict]
    for _ in range(data.draw(st.integers(0, 2))):
        field, e = data.draw(st.integers(0, 6)), data.draw(st.integers(0, n - 1))
        fields[field] = fields[field].copy()
        fields[field][e] = not fields[field][e]
    check(loads_, fields)


def test_a_valid_plan_breaks_nothing() -> None:
    loads_ = np.array([3, 0, 1, 2, 0], np.int64)
    held = np.array([1, 1, 0, 0, 0], bool)
    gpu, cpu = np.array([1, 0, 1, 0, 0], bool), np.array([0, 0, 0, 1, 0], bool)
    sync, scratch = np.array([0, 0, 1, 0, 0], bool), np.zeros(5, bool)
    evict, in_async = np.array([0, 1, 0, 0, 0], bool), np.array([0, 0, 0, 0, 1], bool)
    fields = [gpu, cpu, held, sync, in_async, scratch, evict]
    assert layer_rules_reference(loads_, *fields)[3] == (0, 1, 0, 1)
    check(loads_, fields)
