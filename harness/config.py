"""Structured configs: the dataclasses that validate every Hydra config group.

The schemas are stored in Hydra's ConfigStore; `conf/config.yaml` pulls `base_config` in
first, so every YAML group is merged onto a typed node and a wrong type fails at compose
time. Value checks that a type cannot express (ranges, choices) are in `validate()`,
which raises one-line `HarnessError`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from harness.budget import BudgetConfig
from harness.cost import HardwareConfig
from harness.errors import HarnessError
from harness.hybrid.backend import check_backend
from harness.topology import TopologyConfig, check_config
from harness.tracking import TrackingConfig


@dataclass
class ModelConfig:
    name: str = MISSING  # tiny | mini | flash
    nominal: str = MISSING  # published geometry (llada2_mini | llada2_flash) or 'proxy' for tiny
    path: str | None = None  # real checkpoint directory; null -> proxy weights
    dtype: str = "float32"  # float32 | bfloat16
    proxy_seed: int = 0
    weights: str = "random"  # proxies only: trained (harness/training) | random (seeded, expert bias balanced)


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
WEIGHT_KINDS = ("trained", "random")
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
    _require(m.get("weights", "random") in WEIGHT_KINDS,
             f"model.weights={m.get('weights')!r} is not allowed; use trained or random")
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
