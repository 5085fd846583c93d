"""GPU memory budget -> B, the number of experts each MoE layer may keep on the GPU.

docs/cost-model.md, with GB = 1e9 bytes and bf16 weights:

    B = floor((gpu_gb * GB - non_expert_bytes - reserve_gb * GB) / (n_moe_layers * expert_bytes))

capped at num_experts and at max_experts_per_layer when set. The reserve covers
activations, the KV cache and the runtime. The paper's settings pin B instead
(`experts_per_layer`); a run logs both the B it used and the B the formula derives.

scope: per_layer (default, TIDE's setting): every MoE layer holds at most B experts.
global: the GPU holds at most B x n_moe_layers experts in total, split across layers in
any way (a layer may hold up to all of its experts); Fiddler ranks its static placement
over every (layer, expert) pair then. The engine checks the total after every plan.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from harness.common.errors import HarnessError
from harness.placement.system import MoEGeometry

GB = 1e9
SCOPES = ("per_layer", "global")
BYTES_PER_PARAM = 2
MAX_GPU_GB = 1e6  # a petabyte: above it the byte arithmetic stops being exact, and no GPU is near


@dataclass
class BudgetConfig:
    """Schema of `conf/budget/*.yaml`."""

    name: str = "custom"
    gpu_gb: float = 12.0
    experts_per_layer: int | None = None  # pinned B (the paper's settings); None: derive
    reserve_gb: float = 0.5
    max_experts_per_layer: int | None = None
    scope: str = "per_layer"  # per_layer | global (B x MoE layers in total, any split)
    # true: the pinned experts_per_layer is the paper's setting and applies only to the models
    # whose entry takes the paper's budgets (the LLaDA2 models, harness/zoo); any other model
    # derives B from gpu_gb. false: the pin applies to every model.
    paper: bool = False

    def __post_init__(self) -> None:
        """The checks that need no model (resolve_budget checks B against its experts)."""
        if self.scope not in SCOPES:
            raise HarnessError(f"budget.scope={self.scope!r} is not allowed; use per_layer or global")
        # nan fails every comparison; inf and 1e308 overflow the byte arithmetic
        if not (math.isfinite(self.gpu_gb) and 0 < self.gpu_gb <= MAX_GPU_GB):
            raise HarnessError(f"budget.gpu_gb must be a finite number of GB in (0, {MAX_GPU_GB:g}] "
                               f"(got {self.gpu_gb}); set e.g. budget.gpu_gb=12")
        if not (math.isfinite(self.reserve_gb) and 0 <= self.reserve_gb < self.gpu_gb):
            raise HarnessError(f"budget.reserve_gb must be a finite number of GB in [0, budget.gpu_gb) "
                               f"(got {self.reserve_gb}); the default is 0.5")
        for key in ("experts_per_layer", "max_experts_per_layer"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise HarnessError(f"budget.{key} must be a positive integer or null (got {value})")
        pinned, cap = self.experts_per_layer, self.max_experts_per_layer
        if pinned is not None and cap is not None and pinned > cap:
            raise HarnessError(f"budget.experts_per_layer={pinned} exceeds budget.max_experts_per_layer={cap}")


@dataclass(frozen=True)
class Budget:
    name: str
    gpu_gb: float
    reserve_gb: float
    experts_per_layer: int  # B the run uses
    derived_experts_per_layer: int  # B from the formula (capped)
    pinned: bool
    fits_model: bool  # every expert of every layer fits: nothing needs offloading
    over_budget: bool  # a pinned B whose experts need more than gpu_gb
    non_expert_gb: float
    expert_mb: float
    used_gb: float  # non-expert + reserve + B experts in every MoE layer
    scope: str = "per_layer"  # per_layer | global

    def as_dict(self) -> dict[str, Any]:
        """The run's budget record; `scope` only when global (per_layer is what every
        result written before the option existed means)."""
        out = asdict(self)
        if self.scope == "per_layer":
            del out["scope"]
        return out


def _check_experts(cfg: BudgetConfig, n_experts: int) -> None:
    pinned = cfg.experts_per_layer
    if pinned is not None and pinned > n_experts:
        raise HarnessError(
            f"budget.experts_per_layer={pinned} exceeds the model's {n_experts} experts per layer; "
            f"set it to at most {n_experts} or to null to derive it from budget.gpu_gb"
        )


def resolve_budget(cfg: BudgetConfig, geometry: MoEGeometry, paper_model: bool = True) -> Budget:
    """B for a model of this geometry under this budget, with the figures a run logs. A pin
    that is the paper's (`cfg.paper`) applies only to a model that takes the paper's budgets
    (`paper_model`: its entry says so, harness/zoo); any other derives B from gpu_gb."""
    if cfg.experts_per_layer is not None and cfg.paper and not paper_model:
        cfg = replace(cfg, experts_per_layer=None)
    _check_experts(cfg, geometry.num_experts)
    non_expert = geometry.non_expert_bytes(BYTES_PER_PARAM)
    expert = geometry.expert_bytes(BYTES_PER_PARAM)
    layers = geometry.n_moe_layers
    free = cfg.gpu_gb * GB - non_expert - cfg.reserve_gb * GB
    if free < 0:
        need = (non_expert + cfg.reserve_gb * GB) / GB
        raise HarnessError(
            f"budget.gpu_gb={cfg.gpu_gb} is below the model's non-expert weights ({non_expert / GB:.2f} GB) "
            f"+ budget.reserve_gb ({cfg.reserve_gb}); "
            f"raise budget.gpu_gb to at least {math.ceil(need * 100) / 100}"
        )
    derived = min(int(free // (layers * expert)), geometry.num_experts)
    if cfg.max_experts_per_layer is not None:
        derived = min(derived, cfg.max_experts_per_layer)
    used = cfg.experts_per_layer if cfg.experts_per_layer is not None else derived
    used_bytes = non_expert + cfg.reserve_gb * GB + used * layers * expert
    return Budget(
        name=cfg.name,
        gpu_gb=float(cfg.gpu_gb),
        reserve_gb=float(cfg.reserve_gb),
        experts_per_layer=int(used),
        derived_experts_per_layer=int(derived),
        pinned=cfg.experts_per_layer is not None,
        fits_model=free >= layers * geometry.num_experts * expert,
        over_budget=used_bytes > cfg.gpu_gb * GB,
        non_expert_gb=non_expert / GB,
        expert_mb=expert / 1e6,
        used_gb=used_bytes / GB,
        scope=cfg.scope,
    )
