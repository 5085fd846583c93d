"""The `model` config node: which model (an LLaDA2 model in this package's own code, or a
transformers MoE family served through harness/families/), its weights and dtype."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from harness.common.checks import MAX_SEED, given, require
from harness.model.experts import SUM_ORDERS

LLADA2_NAMES = ("tiny", "mini", "flash")
# transformers MoE families (harness/families/configs/<name>.json; tests/unit/test_families.py
# holds this list to that folder)
FAMILY_NAMES = ("diffusiongemma", "qwen3_moe", "mixtral", "olmoe")
MODEL_NAMES = LLADA2_NAMES + FAMILY_NAMES
DTYPES = ("float32", "bfloat16")
WEIGHT_KINDS = ("trained", "random")  # proxies: harness/training/proxy_cache.py


@dataclass
class ModelConfig:
    name: str = MISSING  # tiny | mini | flash | diffusiongemma | qwen3_moe | mixtral | olmoe
    nominal: str = MISSING  # published geometry (llada2_mini | llada2_flash | a family's name) or 'proxy' for tiny
    path: str | None = None  # real checkpoint directory; null -> proxy weights
    dtype: str = "float32"  # float32 | bfloat16
    proxy_seed: int = 0
    weights: str = "random"  # proxies only: trained (harness/training) | random (seeded, expert bias balanced)
    # LLaDA2 only: each token's routed outputs summed in the router's order (the reference's) or
    # by ascending expert id; both lossless (docs/model-and-decoding.md "Expert sum order")
    expert_sum_order: str = "router"

    def __post_init__(self) -> None:
        require(not given(self.name) or self.name in MODEL_NAMES,
                 f"model.name={self.name!r} is not allowed; use one of {', '.join(MODEL_NAMES)}")
        require(self.weights in WEIGHT_KINDS,
                 f"model.weights={self.weights!r} is not allowed; use trained or random")
        require(not (self.is_family and self.weights == "trained"),
                f"model.weights=trained has no recipe for model={self.name}; its proxy is random (balanced "
                "routers): use model.weights=random or model.path=<checkpoint>")
        require(self.dtype in DTYPES, f"model.dtype={self.dtype!r} is not allowed; use one of {', '.join(DTYPES)}")
        require(self.expert_sum_order in SUM_ORDERS, f"model.expert_sum_order={self.expert_sum_order!r} is not "
                f"allowed; use one of {', '.join(SUM_ORDERS)}")
        require(not (self.is_family and self.expert_sum_order != "router"),
                f"model.expert_sum_order={self.expert_sum_order} applies to LLaDA2 models; model={self.name} sums its "
                "experts as transformers' own experts code does: leave it at router")
        require(0 <= self.proxy_seed <= MAX_SEED, f"model.proxy_seed={self.proxy_seed} must be in [0, 2**63-1]")

    @property
    def is_family(self) -> bool:
        """A transformers family (transformers' modeling and generate), not LLaDA2's own code."""
        return self.name in FAMILY_NAMES
