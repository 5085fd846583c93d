"""One entry per system (`REGISTRY`): its policy class, config dataclass, batch planner and
capabilities; `make_system` builds a system from options."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from harness.accounting.bitsets import as_mask
from harness.accounting.ledger import BatchPlanner
from harness.common.errors import HarnessError
from harness.placement.system import System
from systems.dali import Dali, DaliConfig
from systems.ep_linear import EpLinear, EpLinearConfig
from systems.fiddler import Fiddler, FiddlerBatchPlanner, FiddlerConfig
from systems.gem import Gem, GemConfig
from systems.gpu_only import GpuOnly, GpuOnlyConfig
from systems.mixtral_offload import MixtralOffload, MixtralOffloadConfig
from systems.oracle import Oracle, OracleConfig
from systems.tide import Tide, TideBatchPlanner, TideConfig
from systems.tide_adaptive import TideAdaptive, TideAdaptiveConfig


@dataclass(frozen=True)
class SystemEntry:
    """One system: its policy (the `System` class), its config dataclass, its batch
    planner (a class built from the system and its residency as a bool [L, E] mask, which
    plans chunks of forwards as `plan` would; None: it plans layer by layer) and what it
    needs: topology=multi (expert parallelism) and a calibration trace. The code that asks
    these questions (config checks, runs, replays, the benchmark) reads them here."""

    policy: type[System]
    config: type
    batch_planner: Callable[[Any, np.ndarray], BatchPlanner] | None = None

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def multi_gpu(self) -> bool:
        """Runs only with topology=multi and names each expert's GPU (plan.device)."""
        return self.policy.multi_gpu

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


REGISTRY: dict[str, SystemEntry] = {
    entry.name: entry
    for entry in (
        SystemEntry(GpuOnly, GpuOnlyConfig),
        SystemEntry(Fiddler, FiddlerConfig, FiddlerBatchPlanner),
        SystemEntry(MixtralOffload, MixtralOffloadConfig),
        SystemEntry(Tide, TideConfig, TideBatchPlanner),
        SystemEntry(Oracle, OracleConfig),
        SystemEntry(Dali, DaliConfig),
        SystemEntry(TideAdaptive, TideAdaptiveConfig),
        SystemEntry(EpLinear, EpLinearConfig),
        SystemEntry(Gem, GemConfig),
    )
}

# name -> policy class and name -> config dataclass, as views of the registry
SYSTEMS: dict[str, type[System]] = {name: entry.policy for name, entry in REGISTRY.items()}
SYSTEM_CONFIGS: dict[str, type] = {name: entry.config for name, entry in REGISTRY.items()}


def entry_of(system: System) -> SystemEntry:
    """The registry entry of a system (by its name)."""
    if system.name not in REGISTRY:
        raise HarnessError(f"unknown system {system.name!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[system.name]

# Options of a system's config that set how it is charged, with the original system's
# behaviour as each config's default. overlap: its CPU experts run concurrently with the
# GPU path (max) or after it (sum); harness/accounting/ledger.py charges either.
CHARGING_OPTIONS = ("overlap",)


def system_config(name: str, options: Mapping[str, Any] | None = None) -> Any:
    """The config dataclass of system `name` from plain options (a `name` key, if present,
    must agree). Unknown names and keys are HarnessErrors."""
    if name not in SYSTEMS:
        raise HarnessError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")
    opts = dict(options or {})
    given = opts.pop("name", name)
    if given != name:
        raise HarnessError(f"system options name {given!r} do not match system {name!r}")
    allowed = [f.name for f in fields(SYSTEM_CONFIGS[name]) if f.name != "name"]
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise HarnessError(f"unknown option(s) {unknown} for system={name}; allowed: {allowed or 'none'}")
    return SYSTEM_CONFIGS[name](**opts)


def system_from_config(config: Any) -> System:
    """The system a config dataclass of SYSTEM_CONFIGS describes (HarnessConfig.system).
    Charging options (CHARGING_OPTIONS) are set on the built system rather than passed to
    its constructor: they change what the ledger charges, not what the system plans."""
    name = config.name
    if name not in SYSTEMS or not isinstance(config, SYSTEM_CONFIGS[name]):
        raise HarnessError(f"{type(config).__name__} is not the config of a known system; known: {', '.join(SYSTEMS)}")
    options = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "name"}
    charging = {key: options.pop(key) for key in CHARGING_OPTIONS if key in options}
    system = SYSTEMS[name](**options)
    for key, value in charging.items():
        if not isinstance(value, bool):
            raise HarnessError(f"system.{key} must be true or false (got {value!r})")
        setattr(system, key, value)
    return system


def make_system(name: str, options: Mapping[str, Any] | None = None) -> System:
    """Build system `name` from plain options (tests, the all-GPU decode); a run builds
    its system from the typed config with `system_from_config`."""
    return system_from_config(system_config(name, options))
