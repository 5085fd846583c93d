"""systems/tide_adaptive.py: `_side_sizes`, the experts on each side of a forward's stale
and fresh residency, against numpy masks."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from systems.tide import top_b
from systems.tide_adaptive import _side_sizes
from tests.kernels.support import KERNEL, loads, masks, same_bits, sizes


def side_sizes_reference(loads: np.ndarray, resident: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Test-only reference: int64 [5, n], per row the routed experts resident, the routed
    ones not resident, the routed top-B, the routed ones outside the top-B, and the routed
    top-B not resident."""
    routed = loads > 0
    sides = [routed & resident, routed & ~resident, routed & top, routed & ~top, routed & top & ~resident]
    return np.stack([side.sum(-1, dtype=np.int64) for side in sides]).reshape(5, loads.shape[0])


@KERNEL
@given(st.data())
def test_side_sizes_are_the_numpy_counts(data: st.DataObject) -> None:
    rows, n = data.draw(st.integers(0, 6)), data.draw(sizes(1, 40))
    loads_ = data.draw(loads((rows, n)))
    resident = data.draw(masks((rows, n)))
    # the policy's top is `top_b` of the loads; any mask is in the kernel's domain too
    top = top_b(loads_, data.draw(st.integers(0, n))) if data.draw(st.booleans()) else data.draw(masks((rows, n)))
    assert same_bits(_side_sizes(loads_, resident, top), side_sizes_reference(loads_, resident, top))
