"""`calibration_shared` (harness/routing/calibration_fit.py, docs/routing-regimes.md): unset, a
regime generates the routing it generated before the knob existed, bit for bit; set, only the
calibration requests change; and fitting it to a synthetic trace's held-out calibration
recovers the value it was generated with."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness.common.errors import HarnessError
from harness.routing.calibration_fit import fit_calibration, simulated_overlap, trace_calibration_overlap
from harness.routing.generate import Dims, generate
from harness.routing.params import RegimeFile, RoutingRegime, TraceShape
from harness.routing.replayable import generate_with_calibration, with_calibration

SMALL = Dims(4, 32, 4, {"num_experts_per_tok": 4}, "small")
SHAPE = TraceShape("ar", [32] * 8, [48] * 8, 16)
REGIME = RoutingRegime(skew=1.2, shared=0.7, locality=0.3, decay=0.2, affinity=0.2, prefill_skew=1.0)


def test_unset_calibration_shared_generates_the_routing_of_before() -> None:
    shape = with_calibration(SHAPE, 2)
    before = generate(REGIME, shape, SMALL, seed=3)  # no calibration requests named: one share for all
    after = generate(REGIME, shape, SMALL, seed=3, calibration=2)
    assert np.array_equal(before.loads.numpy(), after.loads.numpy())
    assert "calibration_shared" not in REGIME.as_dict() and before.meta["regime"] == after.meta["regime"]
    equal = generate(replace(REGIME, calibration_shared=REGIME.shared), shape, SMALL, seed=3, calibration=2)
    assert np.array_equal(before.loads.numpy(), equal.loads.numpy())


def test_calibration_shared_changes_only_the_calibration_requests() -> None:
    regime = RegimeFile(replace(REGIME, calibration_shared=0.1), SHAPE, name="t")
    trace, calibration = generate_with_calibration(regime, "small", seed=3, dims=SMALL)
    old, old_calibration = generate_with_calibration(RegimeFile(REGIME, SHAPE, name="t"), "small", seed=3,
                                                     dims=SMALL)
    assert np.array_equal(trace.loads.numpy(), old.loads.numpy())
    assert not np.array_equal(calibration.loads.numpy(), old_calibration.loads.numpy())
    assert trace_calibration_overlap(trace, calibration) < trace_calibration_overlap(old, old_calibration)


@pytest.mark.parametrize("true", [0.15, 0.45])
def test_fit_recovers_calibration_shared_of_a_synthetic_trace(true: float) -> None:
    regime = RegimeFile(replace(REGIME, calibration_shared=true), SHAPE, name="t")
    trace, calibration = generate_with_calibration(regime, "small", seed=11, dims=SMALL)
    target = trace_calibration_overlap(trace, calibration)
    fitted, record = fit_calibration(REGIME, SHAPE, SMALL, target, seed=0)
    assert abs(fitted.calibration_shared - true) <= 0.1, (fitted, record)
    assert abs(record["reached"] - record["target"]) <= 0.01
    # the statistic rises with the knob
    assert simulated_overlap(replace(REGIME, calibration_shared=0.0), SHAPE, SMALL, 0, 2) \
        < simulated_overlap(replace(REGIME, calibration_shared=1.0), SHAPE, SMALL, 0, 2)


def test_calibration_shared_out_of_range_is_a_one_line_error() -> None:
    with pytest.raises(HarnessError, match="calibration_shared"):
        RoutingRegime(calibration_shared=1.5)
    assert RoutingRegime.from_dict({"calibration_shared": 0.3}).calibration_shared == 0.3
