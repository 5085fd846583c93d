"""Modeled tokens/s of one job of a sweep under any hardware profile, by replaying its trace.

A replay is the job's own: the same system, budget, trace and calibration, charged by a
cost model built from the given profile. Nothing is decoded.

Shortcut: some systems decide the same way whatever the cost model, or decide by a few
numbers it yields (a *decision key*): gpu_only and mixtral_offload never ask it; fiddler
asks only whether each load is cheaper on the CPU than copied; tide (tau fixed or random)
never asks, and with tau=auto only through tau*. When a replay's key equals one already
replayed, the placement outcomes recorded then are charged again by the new cost model
(a fresh ledger), which gives the replay's result without planning anything; a test holds
the two to the same bits. Every other system is replayed in full each time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from harness.core.cost import CostModel, HardwareConfig
from harness.core.engine import OffloadEngine
from harness.core.ledger import LayerOutcomes, Ledger
from harness.decode.decoding import StepInfo
from harness.model import LLaDA2Config
from harness.traces.batch_replay import replay_trace
from harness.traces.trace import RoutingTrace
from systems.base import System
from systems.registry import system_from_config

Charge = tuple[list[StepInfo], list[tuple[int, int]], LayerOutcomes, bool]
KeyFn = Callable[[System, CostModel, int], Hashable]


def _no_key(system: System, cost: CostModel, top: int) -> Hashable:
    return ()


def _fiddler_key(system: System, cost: CostModel, top: int) -> Hashable:
    """Fiddler sends a miss with load n to the CPU iff cpu(n) <= copy + gpu(n)."""
    n = top + 1
    rule = cost.time_table("cpu", top)[:n] <= cost.copy_time(1) + cost.time_table("gpu", top)[:n]
    return rule.tobytes()


def _tide_key(system: System, cost: CostModel, top: int) -> Hashable:
    return system.report().get("tau_star")  # None for a fixed or random tau: no cost involved


DECISION_KEYS: dict[str, KeyFn] = {
    "gpu_only": _no_key, "mixtral_offload": _no_key, "fiddler": _fiddler_key, "tide": _tide_key,
}


@dataclass
class JobSpec:
    """What a replay of one job needs."""

    system_config: Any  # the system's config dataclass (HarnessConfig.system)
    geometry: LLaDA2Config
    experts_per_layer: int
    budget_scope: str
    hardware: HardwareConfig  # the profile the job was charged with (loaded)
    trace: RoutingTrace
    calibration: RoutingTrace | None
    decode_steps: int
    generated_tokens: int


class JobReplayer:
    """tokens/s of one job under a profile; remembers outcomes by decision key."""

    def __init__(self, spec: JobSpec, shortcut: bool = True) -> None:
        self.spec = spec
        self.shortcut = shortcut
        self.top = int(spec.trace.loads.max()) if len(spec.trace) else 0
        self._recorded: dict[Hashable, list[Charge]] = {}
        self._busy: dict[str, float] | None = None  # CPU and link use at the job's own profile
        self.replays = self.recharges = 0

    def tokens_per_s(self, hw: HardwareConfig) -> float:
        modeled = self.modeled_seconds(hw)
        return self.spec.generated_tokens / modeled if modeled > 0 else 0.0

    def modeled_seconds(self, hw: HardwareConfig) -> float:
        spec = self.spec
        cost = CostModel(spec.geometry, hw)
        system = system_from_config(spec.system_config)
        engine = OffloadEngine(system, spec.geometry, spec.experts_per_layer, cost, budget_scope=spec.budget_scope)
        engine.prepare(spec.calibration if system.needs_calibration else None, spec.decode_steps)
        key_fn = DECISION_KEYS.get(system.name) if self.shortcut and not engine.topology.multi else None
        key = key_fn(system, cost, self.top) if key_fn is not None else None
        if key_fn is not None and key in self._recorded:
            self.recharges += 1
            return recharge(self._recorded[key], cost, engine.ledger)
        charges: list[Charge] = []
        if key_fn is not None:
            _record_charges(engine.ledger, charges)
        replay_trace(engine, spec.trace)
        self.replays += 1
        figures = engine.ledger.figures()
        if key_fn is not None:
            self._recorded[key] = charges
        if self._busy is None and hw == spec.hardware:
            self._busy = {"cpu": figures["busy_cpu_experts_s"], "link": figures["busy_copies_s"]}
        return figures["modeled_time_s"]

    def never_uses(self, part: str) -> bool:
        """Whether the job, as it decided at its own profile, never used the CPU ("cpu") or
        the link ("link"), and decides without the cost model, so that constants of that
        part cannot change its time."""
        if self._busy is None:
            self.modeled_seconds(self.spec.hardware)
        assert self._busy is not None
        name = self.spec.system_config.name
        return DECISION_KEYS.get(name) is _no_key and part in self._busy and self._busy[part] == 0.0


def _record_charges(ledger: Ledger, charges: list[Charge]) -> None:
    """Keep a copy of every batch of forwards the ledger charges (a live chunk's arrays are
    views of buffers the ledger reuses)."""
    charge = ledger.charge

    def recording(steps: list[StepInfo], sizes: list[tuple[int, int]], out: LayerOutcomes,
                  closed: bool = True) -> None:
        kept = LayerOutcomes(**{f.name: _copy(getattr(out, f.name)) for f in fields(LayerOutcomes)})
        charges.append((list(steps), list(sizes), kept, closed))
        charge(steps, sizes, out, closed)

    ledger.charge = recording  # type: ignore[method-assign]


def _copy(value: Any) -> Any:
    return np.array(value, copy=True) if isinstance(value, np.ndarray) else value


def recharge(charges: list[Charge], cost: CostModel, like: Ledger) -> float:
    """The modeled seconds of recorded outcomes charged by `cost` (a ledger like `like`)."""
    ledger = Ledger(cost, like.n_layers, like.n_experts, like.overlap, like.pipeline_slots)
    for steps, sizes, out, closed in charges:
        ledger.charge(steps, sizes, out, closed)
    return ledger.figures()["modeled_time_s"]
