"""Structured configs: the dataclasses that validate every Hydra config group.

The schemas are stored in Hydra's ConfigStore; `conf/config.yaml` pulls `base_config` in
first, so every YAML group is merged onto a typed node and a wrong type fails at compose
time. Value checks that a type cannot express (ranges, choices) are in `validate()`,
which raises one-line `HarnessError`s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from harness.budget import BudgetConfig, check_budget_numbers
from harness.cost import HardwareConfig
from harness.errors import HarnessError
from harness.hybrid.backend import check_backend
from harness.structured import as_dataclass
from harness.topology import TopologyConfig, check_config
from harness.tracking import TrackingConfig


@dataclass
class ModelConfig:
    name: str = MISSING  # tiny | mini | flash
    nominal: str = MISSING  # published geometry (llada2_mini | llada2_flash) or 'proxy' for tiny
    path: str | None = None  # real checkpoint directory; null -> proxy weights
    dtype: str = "float32"  # float32 | bfloat16
    proxy_seed: int = 0


@dataclass
class DecodeConfig:
    gen_length: int = 32
    block_length: int = 32
    steps: int = 32
    threshold: float = 0.95
    temperature: float = 0.0
    cache: str = "prefix"  # prefix | none
    eos_early_stop: bool = True
    seed: int = 0


@dataclass
class WorkloadConfig:
    name: str = "coding"
    path: str | None = None  # jsonl file (workload=jsonl)
    prompt_field: str = "prompt"  # jsonl key holding the prompt
    prompts: list[str] = field(default_factory=list)


@dataclass
class CalibrationConfig:
    prompts: list[str] = field(default_factory=list)


@dataclass
class TraceConfig:
    path: str | None = None  # replay: a trace.npz; null = the cached trace of this model/workload/decode
    record: bool = False  # live: also save trace.npz (+ calibration.npz) into the run dir


@dataclass
class SystemConfig:
    """Generic system node; each system also registers its own schema (systems/registry)."""

    name: str = MISSING


@dataclass
class HarnessConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    system: Any = MISSING
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    cache_dir: str = "outputs/cache"
    limit_prompts: int | None = None
    show_text: bool = True
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    source: str = "live"  # live: decode with the model | trace: replay a routing trace (harness/replay.py)
    trace: TraceConfig = field(default_factory=TraceConfig)
    resume: bool = False  # skip jobs whose result exists for the same config hash (harness/resume.py)
    backend: str = "auto"  # auto | cpu | cuda | standin (harness/hybrid): where a live run executes its experts


MODEL_NAMES = ("tiny", "mini", "flash")
DTYPES = ("float32", "bfloat16")
CACHE_MODES = ("prefix", "none")
SOURCES = ("live", "trace")


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=HarnessConfig)
    _register_optional_groups(cs)


def _register_optional_groups(cs: ConfigStore) -> None:
    """Each system's options are validated by its own dataclass (systems/registry)."""
    from systems.registry import SYSTEM_CONFIGS

    for name, node in SYSTEM_CONFIGS.items():
        cs.store(group="system", name=f"{name}_schema", node=node)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise HarnessError(message)


def validate(cfg: DictConfig) -> None:
    """Range and choice checks; each failure names the key and what is allowed."""
    m, d = cfg.model, cfg.decode
    _require(
        cfg.workload.path is not None or len(cfg.workload.prompts) > 0,
        f"workload={cfg.workload.name} has no prompts: set workload.path=<file.jsonl> "
        "(one JSON object with a 'prompt' per line) or list workload.prompts",
    )
    _require(m.name in MODEL_NAMES, f"model.name={m.name!r} is not allowed; use one of {', '.join(MODEL_NAMES)}")
    _require(m.dtype in DTYPES, f"model.dtype={m.dtype!r} is not allowed; use one of {', '.join(DTYPES)}")
    _require(d.gen_length > 0, f"decode.gen_length={d.gen_length} must be a positive number of tokens")
    _require(d.block_length > 0, f"decode.block_length={d.block_length} must be positive (32 or 64 in the paper)")
    _require(
        1 <= d.steps <= d.block_length,
        f"decode.steps={d.steps} cannot serve decode.block_length={d.block_length}: "
        "steps per block must be between 1 and block_length",
    )
    _require(0 < d.threshold <= 1, f"decode.threshold={d.threshold} must be in (0, 1]")
    _require(d.temperature >= 0, f"decode.temperature={d.temperature} must be >= 0 (0 = argmax)")
    _require(cfg.source in SOURCES, f"source={cfg.source!r} is not allowed; use live or trace")
    _require(d.cache in CACHE_MODES, f"decode.cache={d.cache!r} is not allowed; use prefix or none")
    _require(
        cfg.limit_prompts is None or cfg.limit_prompts > 0,
        f"limit_prompts={cfg.limit_prompts} must be positive or null",
    )
    check_backend(cfg.get("backend", "auto"))  # cuda without a GPU is a one-line error
    check_config(cfg)  # topology values, and ep_linear/gem only with topology=multi (and vice versa)
    check_numbers(cfg)
    check_lengths(cfg)
    check_system_options(cfg)
    check_tracking(cfg)


# ---- hostile values (issue 14): nan, inf, overflow, lengths the model cannot hold -----------
# Small, separate checks so that they can move into the config dataclasses' __post_init__.

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed


def check_numbers(cfg: DictConfig) -> None:
    """Floats must be finite (nan fails every comparison above, inf passes some of them),
    integers must fit what torch and the budget arithmetic take."""
    d = cfg.decode
    _require(math.isfinite(d.temperature), f"decode.temperature={d.temperature} must be a finite number >= 0 "
             "(0 = argmax; inf would sample uniformly)")
    _require(0 <= d.seed <= MAX_SEED, f"decode.seed={d.seed} must be in [0, 2**63-1]")
    _require(0 <= cfg.model.proxy_seed <= MAX_SEED, f"model.proxy_seed={cfg.model.proxy_seed} must be in [0, 2**63-1]")
    check_budget_numbers(as_dataclass(cfg.budget, BudgetConfig, "budget"))
    as_dataclass(cfg.hardware, HardwareConfig, "hardware").validate()


def check_lengths(cfg: DictConfig) -> None:
    """decode lengths against the model's positions (the published, or the proxy's, geometry;
    a real checkpoint's own config.json and each prompt's token count are checked at load)."""
    from harness.model import nominal_geometry

    d = cfg.decode
    limit = nominal_geometry(cfg.model).max_position_embeddings
    _require(d.gen_length + 1 <= limit,
             f"decode.gen_length={d.gen_length} does not fit model={cfg.model.name}'s {limit} positions "
             f"(prompt + generated tokens); use at most {limit - 1}")
    _require(d.block_length <= limit,
             f"decode.block_length={d.block_length} exceeds model={cfg.model.name}'s {limit} positions")


def check_system_options(cfg: DictConfig) -> None:
    """The system's options have its schema's types (system.prefetch=maybe is not a bool)
    and values its constructor accepts (system.tau=-3), before the run instead of during it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from systems.registry import SYSTEM_CONFIGS, make_system

    name = str(cfg.system.name)
    if name not in SYSTEM_CONFIGS:
        make_system(name)  # the one-line "unknown system" error
    options = OmegaConf.to_container(cfg.system, resolve=True)
    try:
        typed = OmegaConf.merge(OmegaConf.structured(SYSTEM_CONFIGS[name]), options)
    except OmegaConfBaseException as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        key = getattr(exc, "full_key", None)
        raise HarnessError(f"system={name}: system.{key}: {first}" if key else f"system={name}: {first}") from None
    make_system(name, OmegaConf.to_container(typed, resolve=True))


def check_tracking(cfg: DictConfig) -> None:
    """The MLflow URI's form, before the run (a bad scheme used to be reported after it)."""
    tracking = cfg.get("tracking")
    if tracking is not None and tracking.enabled:
        from harness.uris import check_tracking_uri

        check_tracking_uri(str(tracking.uri), "tracking.uri")
        timeout = tracking.get("timeout_s", 5.0)
        _require(math.isfinite(timeout) and 0 < timeout <= 600,
                 f"tracking.timeout_s={timeout} must be a number of seconds in (0, 600]")
