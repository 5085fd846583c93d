"""Every system, one entry each (`REGISTRY`, built from each policy module's `ENTRY`): its
policy class, config dataclass, batch planner, the option sets tests run it with and its
facts (role, decision key, replay cost, figures: systems/entry.py); `make_system` builds a
system from options. Adding a system is its module and one line in `ENTRIES`
(docs/adding-a-system.md)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

from harness.common.errors import HarnessError
from harness.placement.system import System
from systems import (
    dali,
    ep_linear,
    fiddler,
    gem,
    gpu_only,
    mixtral_offload,
    oracle,
    static_split,
    tide,
    tide_adaptive,
)
from systems.entry import ROLES, SystemEntry

# One line per system, in the order reports list them (docs/adding-a-system.md).
ENTRIES: tuple[SystemEntry, ...] = (
    gpu_only.ENTRY,
    fiddler.ENTRY,
    static_split.ENTRY,
    mixtral_offload.ENTRY,
    dali.ENTRY,
    tide.ENTRY,
    tide_adaptive.ENTRY,
    oracle.ENTRY,
    ep_linear.ENTRY,
    gem.ENTRY,
)


def build_registry(entries: tuple[SystemEntry, ...]) -> dict[str, SystemEntry]:
    """name -> entry; two entries with one name are a programming error."""
    registry: dict[str, SystemEntry] = {}
    for entry in entries:
        if entry.name in registry:
            raise ValueError(f"two systems are named {entry.name!r}")
        if entry.policy.config_class is not entry.config:
            raise ValueError(f"{entry.policy.__name__}.config_class is not the entry's {entry.config.__name__}")
        registry[entry.name] = entry
    return registry


REGISTRY: dict[str, SystemEntry] = build_registry(ENTRIES)

# name -> policy class and name -> config dataclass, as views of the registry
SYSTEMS: dict[str, type[System]] = {name: entry.policy for name, entry in REGISTRY.items()}
SYSTEM_CONFIGS: dict[str, type] = {name: entry.config for name, entry in REGISTRY.items()}


def entry_of(system: System) -> SystemEntry:
    """The registry entry of a system (by its name)."""
    return entry_named(system.name)


def entry_named(name: str) -> SystemEntry:
    """The registry entry of system `name`."""
    if name not in REGISTRY:
        raise HarnessError(f"unknown system {name!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def names_with_role(role: str) -> tuple[str, ...]:
    """The systems whose entry has `role` (systems/entry.py ROLES), in the registry's order."""
    if role not in ROLES:
        raise ValueError(f"no role {role!r}; roles: {ROLES}")
    return tuple(name for name, entry in REGISTRY.items() if entry.role == role)


def costly_replays() -> tuple[str, ...]:
    """The systems whose replays are costly (`replay_cost`), in the registry's order."""
    return tuple(name for name, entry in REGISTRY.items() if entry.replay_cost == "costly")


@contextmanager
def registered(entry: SystemEntry) -> Iterator[SystemEntry]:
    """`entry` registered (after every other) for the duration: a test's throwaway system."""
    build_registry((*REGISTRY.values(), entry))  # the same checks as the listed entries get
    REGISTRY[entry.name], SYSTEMS[entry.name], SYSTEM_CONFIGS[entry.name] = entry, entry.policy, entry.config
    try:
        yield entry
    finally:
        for views in (REGISTRY, SYSTEMS, SYSTEM_CONFIGS):
            views.pop(entry.name, None)



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
    """The system a config dataclass of SYSTEM_CONFIGS describes (HarnessConfig.system)."""
    name = getattr(config, "name", None)
    if name not in SYSTEMS or not isinstance(config, SYSTEM_CONFIGS[name]):
        raise HarnessError(f"{type(config).__name__} is not the config of a known system; known: {', '.join(SYSTEMS)}")
    return SYSTEMS[name](config)


def make_system(name: str, options: Mapping[str, Any] | None = None) -> System:
    """Build system `name` from plain options (tests, the all-GPU decode); a run builds
    its system from the typed config with `system_from_config`."""
    return system_from_config(system_config(name, options))
