"""The `model` config node (which model, its weights and dtype) and the nominal geometry it
names: what the cost model charges, whatever weights run."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from harness.common.checks import MAX_SEED, given, require
from harness.model.config import LLaDA2Config
from harness.model.proxy import proxy_config

MODEL_NAMES = ("tiny", "mini", "flash")
DTYPES = ("float32", "bfloat16")
WEIGHT_KINDS = ("trained", "random")  # proxies: harness/training/proxy_cache.py


@dataclass
class ModelConfig:
    name: str = MISSING  # tiny | mini | flash
    nominal: str = MISSING  # published geometry (llada2_mini | llada2_flash) or 'proxy' for tiny
    path: str | None = None  # real checkpoint directory; null -> proxy weights
    dtype: str = "float32"  # float32 | bfloat16
    proxy_seed: int = 0
    weights: str = "random"  # proxies only: trained (harness/training) | random (seeded, expert bias balanced)

    def __post_init__(self) -> None:
        require(not given(self.name) or self.name in MODEL_NAMES,
                 f"model.name={self.name!r} is not allowed; use one of {', '.join(MODEL_NAMES)}")
        require(self.weights in WEIGHT_KINDS,
                 f"model.weights={self.weights!r} is not allowed; use trained or random")
        require(self.dtype in DTYPES, f"model.dtype={self.dtype!r} is not allowed; use one of {', '.join(DTYPES)}")
        require(0 <= self.proxy_seed <= MAX_SEED, f"model.proxy_seed={self.proxy_seed} must be in [0, 2**63-1]")


def nominal_geometry(model_cfg: ModelConfig) -> LLaDA2Config:
    """The published geometry the model's runs are charged as (the proxy's own for tiny)."""
    if model_cfg.nominal == "proxy":
        return proxy_config(model_cfg.name)
    return LLaDA2Config.published(model_cfg.nominal)
