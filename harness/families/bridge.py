"""The bridge: a "harness" experts implementation in transformers' experts interface, which
hands each MoE layer's routing to a router (the offload engine) and returns the stock
output.

Every transformers MoE family computes its routed experts through one pluggable function,
`experts(hidden_states, top_k_index, top_k_weights)`, chosen per call by the experts
module's `config._experts_implementation`. `attach(model, router)` gives every experts
module its MoE-layer index (through the family adapter) and switches the model to
"harness"; per call the bridge computes the layer's load (int64 [E], a bincount of
top_k_index), calls `router.route(layer, load, hint_fn)` and then the implementation the
model was configured with before (transformers' default `grouped_mm`, or `eager`: the
experts class's own forward), so the model's output is bit-identical to the stock model as
it was loaded. (The eager forward loops over the hit experts in Python: on the proxies it
cost 1.5-3x the whole stock forward; python -m harness.bench_live measures it.)
`detach(model)` restores the previous implementation.

hint_fn(channel), when there is a next MoE layer, returns that layer's predicted load [E]
(fp32): its router's probabilities on this layer's router input (`next_gate`), or on that
input's deviation from the layer's running mean (`residual`; harness/model/hints.py),
summed over tokens (computed only if the router calls it). Each slot keeps its layer's
running mean, updated after every call and fresh on attach. Encoder and decoder stacks
(DiffusionGemma) hint within their stack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from harness.common.errors import HarnessError
from harness.families.adapter import FamilyAdapter, MoESite, eager_forward
from harness.families.geometry import FamilyGeometry
from harness.families.registry import adapter_for_model_type
from harness.model.hints import HintFn, RunningMean, channel_hint

IMPLEMENTATION = "harness"


class ExpertRouter(Protocol):
    """What the bridge hands each MoE layer's routing to (the engine's side of the seam)."""

    def route(self, layer: int, load: torch.Tensor, hint_fn: HintFn | None) -> None: ...


@dataclass
class _Slot:
    """What one experts module needs at call time."""

    layer: int
    n_experts: int
    router: ExpertRouter
    adapter: FamilyAdapter
    next_router: nn.Module | None
    compute: Callable  # the experts implementation the model had before it was attached
    router_input: torch.Tensor | None = None  # this layer's router input, set by a pre-hook
    running_mean: RunningMean = field(default_factory=RunningMean)  # of the router input (the residual hint's)

    def hint_fn(self) -> HintFn | None:
        if self.next_router is None or self.router_input is None:
            return None
        x, nxt, adapter, mean = self.router_input, self.next_router, self.adapter, self.running_mean
        return lambda channel: channel_hint(channel, lambda rows: adapter.router_probs(nxt, rows).sum(0), x, mean)


@dataclass
class Bridge:
    """An attached model: its family, geometry, sites and what detach undoes."""

    model: nn.Module
    adapter: FamilyAdapter
    geometry: FamilyGeometry
    sites: list[MoESite]
    saved_implementation: dict[str, Any]
    hooks: list[Any] = field(default_factory=list)


def harness_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The "harness" experts implementation: announce the routing, then compute eagerly."""
    slot: _Slot | None = getattr(self, "_harness_slot", None)
    if slot is None:
        raise RuntimeError(f"{type(self).__name__} runs the 'harness' experts implementation without a bridge; "
                           "attach the model with harness.families.bridge.attach")
    load = torch.bincount(top_k_index.reshape(-1), minlength=slot.n_experts)
    if load.numel() != slot.n_experts:  # expert-parallel sentinels (index == E) would land here
        raise HarnessError(f"MoE layer {slot.layer} routed to expert ids >= {slot.n_experts}; the bridge serves "
                           "unsharded experts only")
    slot.router.route(slot.layer, load, slot.hint_fn())
    if slot.router_input is not None:  # after the hint: it reads the rows of earlier calls only
        slot.running_mean.update(slot.router_input)
    slot.router_input = None  # the hint was the router's to take during route; free the tensor
    return compute_experts(slot, self, hidden_states, top_k_index, top_k_weights)


def compute_experts(slot: _Slot, experts: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The routed experts' arithmetic, as the model computed them before it was attached (a
    function of its own so python -m harness.bench_live can time it)."""
    return slot.compute(experts, hidden_states, top_k_index, top_k_weights)


def register() -> None:
    """Make "harness" a valid experts implementation (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if ALL_EXPERTS_FUNCTIONS.get(IMPLEMENTATION) is not harness_experts_forward:
        type(ALL_EXPERTS_FUNCTIONS).register(IMPLEMENTATION, harness_experts_forward)


def attach(model: nn.Module, router: ExpertRouter) -> Bridge:
    """Route every MoE layer of `model` through `router` (see the module docstring)."""
    if getattr(model, "_harness_bridge", None) is not None:
        raise HarnessError("the model is already attached to a router; detach it first")
    adapter = adapter_for_model_type(getattr(model.config, "model_type", None))
    geometry = adapter.geometry(adapter.name, model.config.to_dict())
    sites = adapter.moe_sites(model, geometry)
    register()
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    # each site keeps computing as the model did: its implementation before the switch
    before = [ALL_EXPERTS_FUNCTIONS.get_interface(s.experts.config._experts_implementation, eager_forward(s.experts))
              for s in sites]
    bridge = Bridge(model, adapter, geometry, sites, model.get_experts_implementation())
    model.set_experts_implementation(IMPLEMENTATION)
    stale = [s for s in sites if s.experts.config._experts_implementation != IMPLEMENTATION]
    if stale:
        model.set_experts_implementation(bridge.saved_implementation)
        raise HarnessError(f"{adapter.name}: set_experts_implementation did not reach {len(stale)} experts modules; "
                           "the bridge cannot serve this model")
    next_router = _next_routers(sites)
    for site, compute in zip(sites, before, strict=True):
        slot = _Slot(site.layer, geometry.num_experts, router, adapter, next_router[id(site)], compute)
        site.experts._harness_slot = slot
        bridge.hooks.append(site.router.register_forward_pre_hook(_stash_input(slot)))
    model._harness_bridge = bridge
    return bridge


def detach(model: nn.Module) -> None:
    """Undo `attach`: hooks and slots go, the previous experts implementation returns."""
    bridge: Bridge | None = getattr(model, "_harness_bridge", None)
    if bridge is None:
        return
    for hook in bridge.hooks:
        hook.remove()
    for site in bridge.sites:
        del site.experts._harness_slot
    model.set_experts_implementation(bridge.saved_implementation)
    del model._harness_bridge


def _next_routers(sites: list[MoESite]) -> dict[int, nn.Module | None]:
    """Each site's next MoE layer's router in the same stack (None for the last)."""
    by_stack = {(s.stack, s.layer): s.router for s in sites}
    return {id(s): by_stack.get((s.stack, s.layer + 1)) for s in sites}


def _stash_input(slot: _Slot):
    def hook(module: nn.Module, args: tuple) -> None:
        slot.router_input = args[0] if args else None

    return hook
