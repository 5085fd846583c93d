"""GPU topology: one GPU (the offloading setting) or several GPUs of unequal speed that
share the experts of every MoE layer (expert parallelism, docs/systems.md: gem).

`conf/topology/*.yaml` (schema `TopologyConfig`):

    single   one GPU; every system of the offloading setting runs here
    multi    n_gpus GPUs (default 4), every expert resident on exactly one of them and
             nothing offloaded; only expert-parallel systems (ep_linear, gem) run here

Relative GPU speeds (1.0 = the hardware profile's GPU) come from `variability`, the
spread between the fastest and the slowest GPU (manufacturing and thermal variation):

    none 0%   low 5%   medium 15%   high 30%

The fastest GPU runs at 1.0 and the slowest at 1 - spread, so every seed of a level has
the same spread; the seed draws the speeds in between (uniformly) and the order of the
GPUs. `speeds` overrides all of that with explicit values (one per GPU).

The expert-parallel layer cost: GPU r's time for the experts it owns is the cost model's
grouped-GEMM time of each routed one (`CostModel.grouped_gpu_expert_times`: the weights
streamed once plus the tensor-core time of its tokens padded to the hardware profile's
`gpu_gemm_tile`, a staircase in the token count) divided by its speed, summed; the GPUs run concurrently and
the layer waits for all of them, so its expert time is the slowest GPU's. The all-to-all
dispatch of tokens is not charged (it is the same for every mapping of one layer's load
to within the imbalance this cost already captures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from harness.common.errors import HarnessError

if TYPE_CHECKING:
    from harness.accounting.cost import CostModel

TOPOLOGIES = ("single", "multi")
MAX_GPUS = 256  # the published models' experts per layer: more GPUs would own none
# spreads placed against the variation measured among same-SKU GPUs (docs/dali-and-gem.md#gem)
VARIABILITY_SPREAD = {"none": 0.0, "low": 0.05, "medium": 0.15, "high": 0.30}


@dataclass
class TopologyConfig:
    """Schema of `conf/topology/*.yaml`."""

    name: str = "single"  # single | multi
    n_gpus: int = 1
    variability: str = "none"  # none | low | medium | high: spread of relative GPU speeds
    seed: int = 0  # draws the speeds inside the spread and the GPUs' order
    speeds: list[float] = field(default_factory=list)  # explicit relative speeds; empty: drawn

    def __post_init__(self) -> None:
        """Bad values are one-line HarnessErrors naming the key."""
        if self.name not in TOPOLOGIES:
            raise HarnessError(f"topology.name={self.name!r} is not allowed; use topology=single or topology=multi")
        if self.variability not in VARIABILITY_SPREAD:
            raise HarnessError(f"topology.variability={self.variability!r} is not allowed; use one of "
                               f"{', '.join(VARIABILITY_SPREAD)}")
        if self.name == "single":
            if self.n_gpus != 1:  # the fix suggested is one the check accepts
                fix = ("leave topology.n_gpus out (it is 1)" if self.n_gpus < 2 else
                       f"use topology=multi topology.n_gpus={min(self.n_gpus, MAX_GPUS)}")
                raise HarnessError(f"topology=single has one GPU (got topology.n_gpus={self.n_gpus}); {fix}")
            return
        if not 2 <= self.n_gpus <= MAX_GPUS:
            raise HarnessError(f"topology.n_gpus={self.n_gpus} must be between 2 and {MAX_GPUS} with topology=multi "
                               "(each GPU owns at least one of a layer's 256 experts; or use topology=single)")
        if not 0 <= self.seed <= 2**63 - 1:
            raise HarnessError(f"topology.seed={self.seed} must be in [0, 2**63-1]")
        if self.speeds and (len(self.speeds) != self.n_gpus
                            or not all(math.isfinite(float(s)) and float(s) > 0 for s in self.speeds)):
            raise HarnessError(
                f"topology.speeds must hold {self.n_gpus} finite positive relative speeds (got {list(self.speeds)}); "
                "or leave it empty to draw them from topology.variability"
            )


@dataclass(frozen=True)
class Topology:
    """The GPUs a run is charged on: their relative speeds (1.0 = the hardware profile)."""

    name: str
    speeds: tuple[float, ...]

    @property
    def n_gpus(self) -> int:
        return len(self.speeds)

    @property
    def multi(self) -> bool:
        return self.name == "multi"

    def gpu_times(self, cost: CostModel, load: torch.Tensor, device: torch.Tensor) -> torch.Tensor:
        """Seconds each GPU spends on the routed experts it owns: float64 [n_gpus]."""
        per_expert = cost.grouped_gpu_expert_times(load)
        busy = torch.zeros(self.n_gpus, dtype=torch.float64).index_add_(0, device.long(), per_expert)
        return busy / torch.tensor(self.speeds, dtype=torch.float64)

    def layer_time(self, cost: CostModel, load: torch.Tensor, device: torch.Tensor) -> float:
        """An expert-parallel layer's expert time: its slowest GPU's."""
        return float(self.gpu_times(cost, load, device).max())


SINGLE = Topology("single", (1.0,))


def gpu_speeds(n_gpus: int, variability: str, seed: int) -> tuple[float, ...]:
    """Relative speeds: fastest 1.0, slowest 1 - spread, the rest uniform in between,
    shuffled by `seed`."""
    if variability not in VARIABILITY_SPREAD:
        raise HarnessError(
            f"topology.variability={variability!r} is not allowed; use one of {', '.join(VARIABILITY_SPREAD)}"
        )
    if n_gpus == 1:
        return (1.0,)
    spread = VARIABILITY_SPREAD[variability]
    gen = torch.Generator().manual_seed(seed)
    middle = 1.0 - spread * torch.rand(n_gpus - 2, generator=gen, dtype=torch.float64)
    speeds = torch.cat([torch.tensor([1.0, 1.0 - spread], dtype=torch.float64), middle])
    return tuple(float(s) for s in speeds[torch.randperm(n_gpus, generator=gen)])


def build_topology(cfg: TopologyConfig | None) -> Topology:
    """The Topology of a `topology` config (None: one GPU); its values were checked when
    it was built."""
    if cfg is None or cfg.name == "single":
        return SINGLE
    if cfg.speeds:
        return Topology("multi", tuple(float(s) for s in cfg.speeds))
    return Topology("multi", gpu_speeds(cfg.n_gpus, cfg.variability, cfg.seed))


def check_system_topology(system_name: str, multi_gpu_system: bool, topology: Topology) -> None:
    """Expert-parallel systems need several GPUs; offloading systems need one."""
    if multi_gpu_system and not topology.multi:
        raise HarnessError(
            f"system={system_name} maps experts over several GPUs; add topology=multi (or pick an "
            "offloading system for topology=single)"
        )
    if topology.multi and not multi_gpu_system:
        raise HarnessError(
            f"system={system_name} runs on one GPU; use topology=single, or system=ep_linear|gem with "
            "topology=multi"
        )
