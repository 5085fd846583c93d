"""The interface every expert-placement policy implements.

A system sees only loads (tokens routed to each expert of one MoE layer at one forward)
and answers with a `LayerPlan` (harness/placement/plan.py). It never touches weights: the
engine owns residency, checks every plan and executes it, so every system runs unchanged
live and in replay.

Layer indices are MoE-layer indices: 0 .. n_moe_layers-1 (dense layers are not counted).

What a system may read in `prepare()` is typed here by small protocols that the layers
above implement (the cost model, the GPU topology, the model's geometry), so that this
interface sits below the code that implements it (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from harness.common.errors import HarnessError
from harness.model.hints import NEXT_GATE
from harness.placement.plan import LayerPlan
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace


class ExpertCosts(Protocol):
    """The seconds a system may ask for while it plans (harness/accounting/cost.py
    `CostModel` implements it): one routed expert on the GPU or the CPU with n tokens,
    `time_table` of either for the loads 0..n-1, and host->GPU copies of whole experts."""

    def gpu_expert_time(self, n_tokens: int) -> float: ...

    def cpu_expert_time(self, n_tokens: int) -> float: ...

    def gpu_expert_times(self, loads: torch.Tensor) -> torch.Tensor: ...

    def grouped_gpu_expert_times(self, loads: torch.Tensor) -> torch.Tensor: ...

    def time_table(self, device: str, top: int) -> np.ndarray: ...

    def copy_time(self, n_experts: int = 1) -> float: ...


class GpuTopology(Protocol):
    """The GPUs an expert-parallel system maps experts onto (harness/accounting/topology.py
    `Topology` implements it): their count and relative speeds (1.0 = the profile's GPU)."""

    n_gpus: int
    speeds: tuple[float, ...]


class MoEGeometry(Protocol):
    """A model's nominal geometry: what the budget and the cost model charge and what a
    system may read. Every kind of model describes itself this way (harness/zoo): LLaDA2
    by harness/model/config.py `LLaDA2Config`, a transformers family by
    harness/families/geometry.py `FamilyGeometry`, under LLaDA2's attribute names.

    A system reads the routing shape and the bytes (the first group); the cost model and the
    budget also read the widths and counts of the rest (docs/cost-model.md)."""

    # ---- what a system may read ----
    @property
    def num_experts(self) -> int: ...

    @property
    def num_experts_per_tok(self) -> int: ...

    @property
    def n_moe_layers(self) -> int: ...

    def expert_bytes(self, bytes_per_param: int = 2) -> int: ...

    def non_expert_bytes(self, bytes_per_param: int = 2) -> int: ...

    # ---- what the cost model and the budget read besides ----
    @property
    def hidden_size(self) -> int: ...

    @property
    def moe_intermediate_size(self) -> int: ...

    @property
    def intermediate_size(self) -> int: ...  # the dense MLP's width

    @property
    def expert_params(self) -> int: ...

    @property
    def attention_params(self) -> int: ...  # per layer

    @property
    def num_attention_heads(self) -> int: ...

    @property
    def num_key_value_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def num_shared_experts(self) -> int | float: ...  # the always-on MLP of an MoE layer, in routed experts

    @property
    def first_k_dense_replace(self) -> int: ...  # the number of dense decoder layers

    @property
    def num_hidden_layers(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_position_embeddings(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...  # what a routing trace stores as its geometry


@dataclass
class PrepareContext:
    """What a system may use for its offline work in `prepare()`."""

    geometry: MoEGeometry  # nominal geometry (what the cost model charges)
    experts_per_layer: int  # B
    cost: ExpertCosts
    calibration: RoutingTrace | None  # gpu_only routing of the calibration prompts
    topology: GpuTopology  # the GPUs (relative speeds); one GPU outside expert parallelism
    decode_steps: int | None = None  # denoising steps per block of the run (T)
    budget_scope: str = "per_layer"  # global: B x layers experts in total, any split (harness/accounting/budget.py)


class System:
    """Base class. Subclasses set `name`, `config_class` and `overlap`, and implement `plan`."""

    name: str = "base"
    overlap: bool = False  # CPU experts run concurrently with GPU experts
    max_loads_in_flight: int = 0  # > 0: misses load while resident experts compute (harness/accounting/pipeline.py)
    wants_hint: bool = False  # ask the engine for next-layer predicted loads
    hint_channel: str = NEXT_GATE  # which of them (harness/model/hints.py HINT_CHANNELS), if it wants one
    needs_calibration: bool = False
    ignores_budget: bool = False  # gpu_only: the engine sizes residency to E, not B
    multi_gpu: bool = False  # expert parallelism: runs only with topology=multi, sets plan.device

    config_class: type | None = None  # the config dataclass: the one place the system's option defaults live

    def __init__(self, config: Any = None, **options: Any) -> None:
        """From a config object of `config_class` (a run's typed config), or from options
        over its defaults (tests, tools): `Tide(tau=3)` is `Tide(TideConfig(tau=3))`. A
        config's `overlap` (a charging option: whether CPU experts run beside the GPU path)
        sets the system's."""
        if self.config_class is not None:
            base = config if config is not None else self.config_class()
            config = replace(base, **options) if options else base
        self.config = config
        overlap = getattr(config, "overlap", None)
        if overlap is not None:
            if not isinstance(overlap, bool):
                raise HarnessError(f"system.overlap must be true or false (got {overlap!r})")
            self.overlap = overlap

    def prepare(self, ctx: PrepareContext) -> None:
        self.ctx = ctx

    def initial_residency(self, n_layers: int, n_experts: int, capacity: int) -> list[set[int]]:
        """What the GPU holds before the first forward (called after `prepare`).
        Default: experts 0..B-1 of every layer."""
        return [set(range(min(capacity, n_experts))) for _ in range(n_layers)]

    def on_step(self, step: StepInfo) -> None:
        pass

    def plan(self, layer: int, load: np.ndarray, hint: torch.Tensor | None,
             resident: np.ndarray) -> LayerPlan:
        """One MoE layer of one forward: `load` is the int64 [E] count of tokens routed to
        each expert (never negative), `hint` the next layer's predicted load (a float [E]
        tensor of the system's `hint_channel`, only for systems with `wants_hint`), `resident` the experts this layer
        holds now (bool [E], read-only: a view of the engine's residency, which the engine
        changes once the plan is applied; copy it to keep it). Leave `load` as it is."""
        raise NotImplementedError

    def report(self) -> dict[str, object]:
        """System-specific figures for result.json (tau*, d, Lat(tau) curve, ...)."""
        return {}
