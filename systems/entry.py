"""What a policy module exports for the registry: `ENTRY = SystemEntry(...)`, naming its
policy class, its config dataclass (the one place its defaults live), its batch planner if
it has one, and the option sets the shared tests and the golden grid run it with.

systems/registry.py lists the entries; everything that needs "every system" (the config
schema, the report's order, the planning benchmark, the golden grid, the invariant tests)
derives it from there (docs/adding-a-system.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from harness.accounting.bitsets import as_mask
from harness.accounting.ledger import BatchPlanner
from harness.placement.system import System


@dataclass(frozen=True)
class SystemEntry:
    """One system: its policy (the `System` class), its config dataclass, its batch
    planner (a class built from the system and its residency as a bool [L, E] mask, which
    plans chunks of forwards as `plan` would; None: it plans layer by layer).

    invariant_options: option sets the registry-wide property test drives it with (each
    keeps the plan rules; the oracle's modeled time bounds each from below).
    golden_variants: extra golden-grid cells, name suffix -> overrides (`tide+async`)."""

    policy: type[System]
    config: type
    batch_planner: Callable[[Any, np.ndarray], BatchPlanner] | None = None
    invariant_options: tuple[Mapping[str, Any], ...] = ({},)
    golden_variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.policy.name

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
