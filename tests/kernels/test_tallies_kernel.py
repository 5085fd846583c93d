"""harness/accounting/tallies.py: the ledger's per-layer tallies in one compiled pass against
numpy reductions."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from harness.accounting.tallies import _tallies, layer_tallies
from tests.kernels.support import KERNEL, loads, masks, same_bits


def tallies_reference(loads: np.ndarray, on_gpu: np.ndarray, missed: np.ndarray) -> tuple:
    """Test-only reference: per layer [n, m], over the routed experts (load > 0): the
    token-expert pairs, the pairs of missed experts, the tokens on the CPU; the experts on
    the GPU, on the CPU, on the GPU and resident, on the GPU and missed; and the largest
    load (0 for none)."""
    routed = loads > 0
    gpu, cpu = routed & on_gpu, routed & ~on_gpu

    def count(mask: np.ndarray) -> np.ndarray:
        return mask.sum(-1, dtype=np.int64)

    def tokens(mask: np.ndarray) -> np.ndarray:
        return np.where(mask, loads, 0).sum(-1, dtype=np.int64)

    top = int(loads.max()) if loads.size else 0
    return (tokens(routed), tokens(routed & missed), tokens(cpu), count(gpu), count(cpu), count(gpu & ~missed),
            count(gpu & missed), max(top, 0))


@KERNEL
@given(st.data())
def test_tallies_are_the_numpy_reductions(data: st.DataObject) -> None:
    shape = (data.draw(st.integers(0, 4)), data.draw(st.integers(0, 4)), data.draw(st.integers(0, 12)))
    loads_ = data.draw(loads(shape, top=data.draw(st.sampled_from([1, 9, 5000]))))
    on_gpu, missed = data.draw(masks(shape)), data.draw(masks(shape))
    got, want = _tallies(loads_, on_gpu, missed), tallies_reference(loads_, on_gpu, missed)
    assert len(got) == len(want)
    for field, (a, b) in enumerate(zip(got, want, strict=True)):
        assert same_bits(a, b), field
    tallies = layer_tallies(loads_, on_gpu, missed)  # the wrapper names them in the same order
    assert same_bits(tallies.n_to_load, want[6]) and tallies.top == want[7]
