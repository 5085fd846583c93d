"""What the kernel tests share: hypothesis settings, input strategies and the bit-for-bit
comparison."""

from __future__ import annotations

from functools import reduce
from operator import add

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# the first example compiles a kernel (or loads numba's cache): no per-example deadline
KERNEL = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same_bits(got: object, want: object) -> bool:
    """Equal shapes and values, floats compared by their bits (0.0 and -0.0 differ)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    if got.dtype.kind == "f" or want.dtype.kind == "f":
        return bool(np.array_equal(np.asarray(got, np.float64).view(np.uint64),
                                   np.asarray(want, np.float64).view(np.uint64)))
    return bool(np.array_equal(got, want))


def in_order_sum(values: list[float]) -> float:
    """0.0 + v0 + v1 + ..., left to right (Python's sum() compensates from 3.12 on)."""
    return reduce(add, values, 0.0)


def sizes(low: int = 0, high: int = 40) -> st.SearchStrategy[int]:
    return st.integers(low, high)


def loads(n: int | tuple[int, ...], top: int = 12) -> st.SearchStrategy[np.ndarray]:
    """int64 token counts of shape n, many of them 0 (unrouted) and many ties."""
    return hnp.arrays(np.int64, n, elements=st.integers(0, top) | st.just(0))


def masks(shape: int | tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.bool_, shape, elements=st.booleans())


def seconds(shape: int | tuple[int, ...], coarse: bool | None = None) -> st.SearchStrategy[np.ndarray]:
    """float64 times >= 0: on a coarse grid (exact ties) or arbitrary finite values."""
    grid = st.integers(0, 40).map(lambda k: k * 0.25)
    fine = st.floats(0.0, 1e3, allow_nan=False, allow_infinity=False)
    elements = grid if coarse else fine if coarse is False else grid | fine
    return hnp.arrays(np.float64, shape, elements=elements)
