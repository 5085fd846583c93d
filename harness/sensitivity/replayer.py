"""Modeled tokens/s of one job of a sweep under any hardware profile, by replaying its trace.

A replay is the job's own: the same system, budget, trace and calibration, charged by a
cost model built from the given profile. Nothing is decoded.

Shortcut: a system whose entry names a *decision key* (systems/entry.py: what of the cost
model its decisions depend on, defined beside its own rule) decides alike under two cost
models that give the same key. When a replay's key equals one already replayed, the
placement outcomes the ledger recorded then are charged again by the new cost model
(harness/sensitivity/recharge.py, the ledger's own charge rule), which gives the replay's
result without planning anything; a test holds the two to the same bits. A new key after
the job's own 1x replay is only planned (no ledger) and charged by the re-charge. A system
without a key is replayed in full each time (docs/sensitivity.md).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.accounting.cost import CostModel, HardwareConfig
from harness.accounting.ledger import Ledger
from harness.accounting.outcomes import OutcomeRecorder
from harness.engine.engine import OffloadEngine
from harness.placement.system import MoEGeometry
from harness.placement.trace import RoutingTrace
from harness.sensitivity.recharge import RecordedOutcomes
from harness.traces.batch_replay import batch_refusal, planned_chunks, replay_trace
from systems.registry import entry_named, entry_of, system_from_config

KEPT_OUTCOMES = 2  # recorded outcomes a replayer keeps (by decision key; a gen-1024 replay's take ~0.3 GB)


@dataclass
class JobSpec:
    """What a replay of one job needs."""

    system_config: Any  # the system's config dataclass (HarnessConfig.system)
    geometry: MoEGeometry
    experts_per_layer: int
    budget_scope: str
    hardware: HardwareConfig  # the profile the job was charged with (loaded)
    trace: RoutingTrace
    calibration: RoutingTrace | None
    decode_steps: int
    generated_tokens: int
    loads: np.ndarray | None = None  # the trace's loads as int64 [F, L, E], shared by the jobs of a trace


def trace_loads(trace: RoutingTrace) -> np.ndarray:
    return trace.loads.numpy().astype(np.int64)


class JobReplayer:
    """tokens/s of one job under a profile; remembers outcomes by decision key."""

    def __init__(self, spec: JobSpec, shortcut: bool = True) -> None:
        self.spec = spec
        self.shortcut = shortcut
        if spec.loads is None:
            spec.loads = trace_loads(spec.trace)
        self.top = int(spec.loads.max()) if spec.loads.size else 0
        self._recorded: dict[Hashable, RecordedOutcomes] = {}
        self._busy: dict[str, float] | None = None  # CPU and link use at the job's own profile
        self.replays = self.recharges = 0
        self.planned = 0  # replays that only planned (no ledger): their outcomes charged by the re-charge

    def tokens_per_s(self, hw: HardwareConfig) -> float:
        modeled = self.modeled_seconds(hw)
        return self.spec.generated_tokens / modeled if modeled > 0 else 0.0

    def modeled_seconds(self, hw: HardwareConfig) -> float:
        spec = self.spec
        cost = CostModel(spec.geometry, hw)
        system = system_from_config(spec.system_config)
        engine = OffloadEngine(system, spec.geometry, spec.experts_per_layer, cost, budget_scope=spec.budget_scope)
        engine.prepare(spec.calibration if system.needs_calibration else None, spec.decode_steps)
        key_fn = entry_of(system).decision_key if self.shortcut and not engine.topology.multi else None
        key = key_fn(system, cost, self.top) if key_fn is not None else None
        if key_fn is not None and key in self._recorded:
            self.recharges += 1
            return self._recorded[key].modeled_seconds(cost)
        self.replays += 1
        if key_fn is not None and self._busy is not None and batch_refusal(engine, spec.trace) is None:
            # decisions only: the ledger's charge of a full replay is what the re-charge
            # computes again, so it is done once, by the re-charge
            self.planned += 1
            prepared = self._keep(key, _planned(engine, spec.trace, spec.loads), engine.ledger)
            return prepared.modeled_seconds(cost)
        if key_fn is not None:  # the ledger keeps what it charges, to be charged again
            engine.ledger.recorder = OutcomeRecorder(spec.loads)
        replay_trace(engine, spec.trace)
        figures = engine.ledger.figures()
        if engine.ledger.recorder is not None:
            self._keep(key, engine.ledger.recorder, engine.ledger)
        if self._busy is None and hw == spec.hardware:
            self._busy = {"cpu": figures["busy_cpu_experts_s"], "link": figures["busy_copies_s"]}
        return figures["modeled_time_s"]

    def _keep(self, key: Hashable, recorder: OutcomeRecorder, ledger: Ledger) -> RecordedOutcomes:
        """Keep a replay's outcomes under its decision key, ready to be charged again."""
        while len(self._recorded) >= KEPT_OUTCOMES:  # the oldest goes: outcomes of a long trace take GBs
            self._recorded.pop(next(iter(self._recorded)))
        prepared = RecordedOutcomes(recorder.batches, ledger.n_layers, ledger.overlap, ledger.pipeline_slots,
                                    self.spec.loads)
        self._recorded[key] = prepared
        return prepared

    def never_uses(self, part: str) -> bool:
        """Whether the job, as it decided at its own profile, never used the CPU ("cpu") or
        the link ("link"), and decides without the cost model, so that constants of that
        part cannot change its time."""
        if self._busy is None:
            self.modeled_seconds(self.spec.hardware)
        assert self._busy is not None
        entry = entry_named(self.spec.system_config.name)
        return entry.decides_without_cost and part in self._busy and self._busy[part] == 0.0


def _planned(engine: OffloadEngine, trace: RoutingTrace, loads: np.ndarray) -> OutcomeRecorder:
    """The system's outcomes over the trace, chunk by chunk, recorded as the ledger's recorder
    keeps a full replay's."""
    recorder = OutcomeRecorder(loads)
    for steps, sizes, out in planned_chunks(engine, trace, loads):
        recorder.add(steps, sizes, out)
    return recorder
