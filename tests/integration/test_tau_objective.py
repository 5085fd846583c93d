"""tau* against a brute force: replaying TIDE at every tau = 1..T over the calibration trace
(the engine's full charging), the tau the solver picks costs at most 2% more modeled time
than the best one, for overlapped and for sequential charging."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.accounting.cost import CostModel, HardwareConfig
from harness.cli.overrides import compose_checked
from harness.engine.engine import OffloadEngine
from harness.job.artifacts import calibration_trace
from harness.job.config import register_configs
from harness.model.config import LLaDA2Config
from harness.placement.trace import RoutingTrace
from harness.zoo.entry import load_model, nominal_geometry
from systems.registry import make_system
from systems.tide_tau import solve_tau
from tests.unit.test_tau_solver import GEO, drifting_trace

register_configs()
TOLERANCE = 1.02


def replayed_time(trace: RoutingTrace, geometry: LLaDA2Config, capacity: int, cost: CostModel,
                  options: dict) -> tuple[float, int]:
    """(modeled seconds, the tau it ran with) of TIDE replayed over `trace`, calibrated on it."""
    engine = OffloadEngine(make_system("tide", options), geometry, capacity, cost)
    engine.prepare(trace)
    return engine.replay(trace)["modeled_time_s"], engine.system.tau


def assert_tau_star_near_the_best(trace: RoutingTrace, geometry: LLaDA2Config, capacity: int, cost: CostModel,
                                  overlap: bool, steps: int) -> None:
    brute = [replayed_time(trace, geometry, capacity, cost, {"tau": tau, "overlap": overlap})[0]
             for tau in range(1, steps + 1)]
    chosen, tau_star = replayed_time(trace, geometry, capacity, cost, {"overlap": overlap})
    assert 1 <= tau_star <= steps
    assert chosen <= TOLERANCE * min(brute), (tau_star, brute)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize(("d", "pcie_gbps"), [(0.03, 1.0), (0.1, 6.0), (0.3, 8.0), (0.1, 25.0)])
def test_tau_star_is_within_two_percent_of_the_replayed_best_on_a_drifting_trace(d, pcie_gbps, overlap):
    trace = drifting_trace(d, steps=12, blocks=6, seed=3)
    assert_tau_star_near_the_best(trace, GEO, 16, CostModel(GEO, HardwareConfig(pcie_gbps=pcie_gbps)), overlap, 12)


@pytest.mark.slow  # decodes the calibration prompts on tiny (cached afterwards)
@pytest.mark.parametrize("overlap", [True, False])
def test_tau_star_is_within_two_percent_of_the_replayed_best_on_tiny_calibration(proxy_cache, overlap):
    cfg = compose_checked(["model=tiny", f"cache_dir={proxy_cache}", "tracking.enabled=false"])
    settings = replace(cfg.decode, gen_length=32, block_length=16, steps=16, cache="prefix")
    trace = calibration_trace(cfg, settings, lambda: load_model(cfg.model, cfg.cache_dir))
    geometry = nominal_geometry(cfg.model)
    # a slow link, so that refreshing every step is not free and tau* is an inner choice
    cost = CostModel(geometry, HardwareConfig(pcie_gbps=2.0))
    assert_tau_star_near_the_best(trace, geometry, 24, cost, overlap, 16)


def test_the_objective_follows_the_charging() -> None:
    """Overlapped charging hides CPU misses behind the GPU experts, so it never refreshes
    more often than sequential charging; the paper's objective is kept as overlap=None."""
    trace = drifting_trace(0.1, steps=12, blocks=6, seed=3)
    cost = CostModel(GEO, HardwareConfig(pcie_gbps=6.0))
    paper, seq, ovl = (solve_tau(trace, 16, cost, overlap=o) for o in (None, False, True))
    assert (paper.objective, seq.objective, ovl.objective) == ("paper", "charged-sequential", "charged-overlap")
    summed = [a + b for a, b in zip(paper.lat_io_curve, paper.lat_cpu_curve, strict=True)]
    assert paper.lat_curve == pytest.approx(summed)
    assert all(o <= s for o, s in zip(ovl.lat_curve, seq.lat_curve, strict=True))
    assert ovl.tau_star >= seq.tau_star
    tide = make_system("tide", {"overlap": False})
    assert tide.overlap is False and make_system("tide").overlap is True
