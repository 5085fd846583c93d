"""harness/accounting/counting_sort.py: the compiled heaviest-first order against the stable
descending argsort."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from harness.accounting.counting_sort import heaviest_first
from tests.kernels.support import KERNEL, loads, same_bits, sizes


def heaviest_first_reference(loads: np.ndarray) -> np.ndarray:
    """Test-only reference: the routed experts (load > 0), most tokens first, ties to the
    lower id: a stable argsort of the negated loads without the unrouted ones."""
    order = np.argsort(-loads, kind="stable")
    return order[loads[order] > 0]


def test_heaviest_first_is_the_stable_descending_argsort_of_the_routed_experts() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):
        loads = rng.integers(0, int(rng.integers(1, 12)), int(rng.integers(0, 40))).astype(np.int64)
        assert same_bits(heaviest_first(loads), heaviest_first_reference(loads))


@KERNEL
@given(st.data())
def test_heaviest_first_on_any_load(data: st.DataObject) -> None:
    loads_ = data.draw(loads(data.draw(sizes()), top=data.draw(st.sampled_from([1, 3, 300]))))
    assert same_bits(heaviest_first(loads_), heaviest_first_reference(loads_))


def test_heaviest_first_edge_cases() -> None:
    for loads_ in ([], [0, 0, 0], [5], [2, 2, 2, 2], [0, 7, 0, 7, 1], [10_000, 1, 10_000]):
        row = np.array(loads_, np.int64)
        assert same_bits(heaviest_first(row), heaviest_first_reference(row))
