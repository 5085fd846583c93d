"""A system is treated by its entry (systems/entry.py, docs/adding-a-system.md): a throwaway
system registered here, with a role, a decision key, a replay cost and figures, is a
baseline to the report and to the sensitivity analysis, is re-charged by its key, is left
out of sensitivity's replays by its cost, and adds its figures to a run's measures; nothing
names it anywhere in the harness."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from harness.accounting.cost import HardwareConfig
from harness.bench import synthetic_trace
from harness.job.measures import replacement_horizon, system_figures
from harness.model.config import LLaDA2Config
from harness.placement.plan import LayerPlan
from harness.placement.system import ExpertCosts, System
from harness.report.tables import with_speedups
from harness.sensitivity.__main__ import command
from harness.sensitivity.analysis import Roles
from harness.sensitivity.replayer import JobReplayer, JobSpec
from harness.sensitivity.scaling import scaled
from harness.traces.dali_measures import DEFAULT_HORIZON
from systems.entry import SystemEntry, cost_free
from systems.registry import costly_replays, make_system, names_with_role, registered, system_config

MINI = LLaDA2Config.published("llada2_mini")


@dataclass
class ThrowawayConfig:
    name: str = "throwaway"
    overlap: bool = True
    horizon: int = 3  # read by its entry's measure_horizon


class Throwaway(System):
    """Resident experts on the GPU, every other routed expert on the CPU: it never asks the
    cost model."""

    name = "throwaway"
    config_class = ThrowawayConfig

    def plan(self, layer: int, load: np.ndarray, hint: torch.Tensor | None, resident: np.ndarray) -> LayerPlan:
        routed = load > 0
        return LayerPlan(gpu=routed & resident, cpu=routed & ~resident)


def throwaway_figures(system: Any) -> dict[str, float]:
    return {"throwaway_figure": 7.0}


def counted_key(system: System, cost: ExpertCosts, top: int) -> Hashable:
    """A key that varies with the CPU's table (the system does not read it: re-charges
    stay exact whatever the key)."""
    return cost.time_table("cpu", top)[: top + 1].tobytes()


def entry(**facts: Any) -> SystemEntry:
    return SystemEntry(Throwaway, ThrowawayConfig, **facts)


def test_an_entry_refuses_an_unknown_role_or_replay_cost() -> None:
    with pytest.raises(ValueError, match="role"):
        entry(role="favourite")
    with pytest.raises(ValueError, match="replay_cost"):
        entry(replay_cost="free")


def test_roles_and_replay_cost_come_from_the_entry() -> None:
    assert "throwaway" not in names_with_role("baseline") + names_with_role("reference") + costly_replays()
    with registered(entry(role="baseline", replay_cost="costly")):
        assert names_with_role("baseline")[-1] == "throwaway" and "throwaway" in costly_replays()
        assert "throwaway" in Roles().baselines and "throwaway" not in Roles().references
        assert "throwaway" in command_defaults("baselines") and "throwaway" in command_defaults("skip")
        # the report's speedup is over the best baseline of the row: the throwaway's 2.0 here
        df = pd.DataFrame({"row": ["a", "a", "a"], "system_label": ["throwaway", "x", "y"],
                           "tokens_per_s": [2.0, 3.0, 1.0]})
        assert with_speedups(df, ["row"])["speedup"].tolist() == [1.0, 1.5, 0.5]
    with registered(entry(role="reference")):
        assert "throwaway" in Roles().references and "throwaway" in command_defaults("references")
        assert "throwaway" not in command_defaults("skip")
    assert "throwaway" not in names_with_role("reference")


def command_defaults(name: str) -> list[str]:
    return str(next(o.default for o in command().options if o.name == name)).split(",")


def replayer(shortcut: bool = True) -> JobReplayer:
    trace = synthetic_trace(MINI, steps=24, tokens=24, block=8, seed=4)
    spec = JobSpec(system_config("throwaway"), MINI, 64, "per_layer", HardwareConfig(), trace, None, 8, 64)
    return JobReplayer(spec, shortcut)


PROFILES = [HardwareConfig(), scaled(HardwareConfig(), "cpu_tflops", 3.0), scaled(HardwareConfig(), "pcie_gbps", 0.3),
            scaled(HardwareConfig(), "cpu_tflops", 3.0)]


@pytest.mark.parametrize("key", [cost_free, counted_key, None])
def test_sensitivity_recharges_a_system_by_its_entrys_decision_key(key) -> None:
    with registered(entry(decision_key=key)):
        fast, full = replayer(), replayer(shortcut=False)
        assert [fast.modeled_seconds(p) for p in PROFILES] == [full.modeled_seconds(p) for p in PROFILES]
        assert full.recharges == 0
        if key is cost_free:  # one key for every profile: a single replay, the rest re-charged
            assert (fast.replays, fast.recharges) == (1, 3)
            assert fast.never_uses("link") == (fast._busy["link"] == 0.0)
        elif key is counted_key:  # a new CPU table is a new key, replayed; a known one re-charged
            assert (fast.replays, fast.recharges) == (2, 2)
            assert not fast.never_uses("cpu") and not fast.never_uses("link")
        else:  # no key: every profile replayed in full
            assert (fast.replays, fast.recharges) == (4, 0)
            assert not fast.never_uses("cpu")


def test_a_runs_figures_and_measure_horizon_come_from_the_entry() -> None:
    with registered(entry()):
        assert system_figures(make_system("throwaway")) == {}
        assert replacement_horizon(system_config("throwaway")) == DEFAULT_HORIZON
    with registered(entry(figures=throwaway_figures, measure_horizon=lambda config: config.horizon)):
        assert system_figures(make_system("throwaway")) == {"throwaway_figure": 7.0}
        assert replacement_horizon(system_config("throwaway", {"horizon": 5})) == 5
