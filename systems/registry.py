"""Name -> system class and config dataclass; `make_system` builds one from options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from harness.errors import HarnessError
from systems.base import System
from systems.dali import Dali, DaliConfig
from systems.ep_linear import EpLinear, EpLinearConfig
from systems.fiddler import Fiddler, FiddlerConfig
from systems.gem import Gem, GemConfig
from systems.gpu_only import GpuOnly, GpuOnlyConfig
from systems.mixtral_offload import MixtralOffload, MixtralOffloadConfig
from systems.oracle import Oracle, OracleConfig
from systems.tide import Tide, TideConfig
from systems.tide_adaptive import TideAdaptive, TideAdaptiveConfig

SYSTEMS: dict[str, type[System]] = {
    "gpu_only": GpuOnly,
    "fiddler": Fiddler,
    "mixtral_offload": MixtralOffload,
    "tide": Tide,
    "oracle": Oracle,
    "dali": Dali,
    "tide_adaptive": TideAdaptive,
    "ep_linear": EpLinear,
    "gem": Gem,
}

SYSTEM_CONFIGS: dict[str, type] = {
    "gpu_only": GpuOnlyConfig,
    "fiddler": FiddlerConfig,
    "mixtral_offload": MixtralOffloadConfig,
    "tide": TideConfig,
    "oracle": OracleConfig,
    "dali": DaliConfig,
    "tide_adaptive": TideAdaptiveConfig,
    "ep_linear": EpLinearConfig,
    "gem": GemConfig,
}


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
    name = config.name
    if name not in SYSTEMS or not isinstance(config, SYSTEM_CONFIGS[name]):
        raise HarnessError(f"{type(config).__name__} is not the config of a known system; known: {', '.join(SYSTEMS)}")
    return SYSTEMS[name](**{f.name: getattr(config, f.name) for f in fields(config) if f.name != "name"})


def make_system(name: str, options: Mapping[str, Any] | None = None) -> System:
    """Build system `name` from plain options (tests, the all-GPU decode); a run builds
    its system from the typed config with `system_from_config`."""
    return system_from_config(system_config(name, options))
