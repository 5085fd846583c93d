"""What a policy module exports for the registry: `ENTRY = SystemEntry(...)`, naming its
policy class, its config dataclass (the one place its defaults live), its batch planner if
it has one, the option sets the shared tests and the golden grid run it with, and every
other fact the harness knows about the system: its role in comparisons (reference,
baseline, contender), the decision key the sensitivity analysis re-charges by, what a
replay of it costs, the figures a run of it adds, the horizon of its workload score.

systems/registry.py lists the entries; everything that needs "every system" or a fact of
one (the config schema, the report's order and baselines, the planning benchmark, the
golden grid, the invariant tests, the sensitivity analysis, a run's measures) derives it
from there, never from a system's name (docs/adding-a-system.md)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from harness.accounting.bitsets import as_mask
from harness.accounting.ledger import BatchPlanner
from harness.placement.system import ExpertCosts, System

ROLES = ("reference", "baseline", "contender")
REPLAY_COSTS = ("cheap", "costly")

# A decision key: (the prepared system, the cost model, the trace's largest load) -> a value
# that two cost models give alike only if the system decides alike under both
# (docs/sensitivity.md: re-charges).
DecisionKey = Callable[[System, ExpertCosts, int], Hashable]


def cost_free(system: System, cost: ExpertCosts, top: int) -> Hashable:
    """The decision key of a system that never asks the cost model: one key for all."""
    return ()


@dataclass(frozen=True)
class SystemEntry:
    """One system: its policy (the `System` class), its config dataclass, its batch
    planner (a class built from the system and its residency as a bool [L, E] mask, which
    plans chunks of forwards as `plan` would; None: it plans layer by layer).

    invariant_options: option sets the registry-wide property test drives it with (each
    keeps the plan rules; the oracle's modeled time bounds each from below).
    golden_variants: extra golden-grid cells, name suffix -> overrides (`tide+async`).
    role: how comparisons treat it (its plain label, as charged by its original): a
        "reference" is a bound, shown but never the winner (gpu_only, the oracle); a
        "baseline" is what the speedup is over (the report's speedup column, sensitivity's
        margin); a "contender" is compared against the baselines.
    decision_key: what of the cost model its decisions depend on (`cost_free`: nothing),
        defined beside its own rule and sharing its expression; the sensitivity analysis
        charges recorded outcomes again while the key is unchanged. None: no key, every
        sensitivity replay plans again.
    replay_cost: "costly" when one replay takes seconds (the oracle re-solves its placement):
        the sensitivity analysis leaves it out by default (`skip`).
    figures: figures a run of it adds to result.json when the run computes the papers'
        measures (GEM's profiling cost), from the prepared system.
    about: what `python -m harness --help` says of `system=<name>` (default: the policy
        class's docstring).
    measure_horizon: the horizon of the time-correlation score that DALI's cache replay (a
        run's measures, harness/traces/dali_measures.py) uses in runs of this system, from its
        config; None: the replay's default."""

    policy: type[System]
    config: type
    batch_planner: Callable[[Any, np.ndarray], BatchPlanner] | None = None
    invariant_options: tuple[Mapping[str, Any], ...] = ({},)
    golden_variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    role: str = "contender"
    decision_key: DecisionKey | None = None
    replay_cost: str = "cheap"
    figures: Callable[[Any], dict[str, float]] | None = None
    measure_horizon: Callable[[Any], int] | None = None
    about: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.policy.__name__}: role {self.role!r} is not one of {ROLES}")
        if self.replay_cost not in REPLAY_COSTS:
            raise ValueError(f"{self.policy.__name__}: replay_cost {self.replay_cost!r} is not one of {REPLAY_COSTS}")

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def description(self) -> str:
        """`about`, else the policy class's docstring (its first sentence is the help line)."""
        return self.about or " ".join((self.policy.__doc__ or self.name).split())

    @property
    def decides_without_cost(self) -> bool:
        """Its decisions never ask the cost model (`decision_key` is `cost_free`)."""
        return self.decision_key is cost_free

    @property
    def multi_gpu(self) -> bool:
        """Runs only with topology=multi and names each expert's GPU (plan.device)."""
        return self.policy.multi_gpu

    @property
    def report_labels(self) -> tuple[str, ...]:
        """The names the report gives this system: its own, and the one it gets when charged
        against its default overlap (`tide_sequential`, `fiddler_overlapped`)."""
        overlap = {f.name: f.default for f in fields(self.config)}.get("overlap")
        if overlap is True:
            return self.name, f"{self.name}_sequential"
        if overlap is False:
            return self.name, f"{self.name}_overlapped"
        return (self.name,)

    def needs_calibration(self, system: System) -> bool:
        """Whether this system, as configured, learns from a calibration trace (tide: with
        tau=auto only)."""
        return system.needs_calibration

    def plans_in_batch(self, system: System) -> bool:
        """A batch planner exists and `system` is this entry's policy itself: a subclass
        (a test's variant) may plan differently, so it plans layer by layer."""
        return self.batch_planner is not None and type(system) is self.policy

    def planner(self, system: System, resident: list[set[int]], n_experts: int) -> BatchPlanner:
        if not self.plans_in_batch(system):
            raise ValueError(f"system {system.name!r} does not plan in batch")
        assert self.batch_planner is not None
        return self.batch_planner(system, as_mask(resident, n_experts))
