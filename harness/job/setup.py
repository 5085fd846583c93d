"""What live runs (harness/job/live.py) and replays (harness/job/replay.py) share: the system,
budget, hardware and cost model a run charges with (`setup_run`), and the result they
build from the engine's summary (`build_result`)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import hydra
import numba
import numpy
import torch

import harness
from harness.accounting.breakdown import cost_breakdown
from harness.accounting.budget import Budget, resolve_budget
from harness.accounting.cost import CostModel, HardwareConfig
from harness.accounting.profiling import load_hardware
from harness.accounting.topology import SINGLE, Topology, build_topology
from harness.common.machine import machine_environment
from harness.engine.engine import OffloadEngine
from harness.job.artifacts import code_version
from harness.job.config import HarnessConfig
from harness.job.measures import (
    measure_figures,
    replacement_horizon,
    system_figures,
    wants_dali_measures,
    wants_measures,
)
from harness.placement.system import MoEGeometry, System
from harness.placement.trace import RoutingTrace
from harness.results.run_result import DuplicateMetricError, RunIdentity, RunResult, Timing, is_number
from systems.registry import entry_of, system_from_config


@dataclass
class RunSetup:
    """What a run charges and decides with: the same for live and replay runs."""

    system: System
    geometry: MoEGeometry
    budget: Budget
    hardware: HardwareConfig
    cost: CostModel
    topology: Topology = SINGLE
    measures: bool = False  # DALI's measures: the ledger keeps per-phase accounts (harness/job/measures.py)
    system_figures: bool = False  # the figures the system's entry adds (GEM's profiling cost)

    @property
    def needs_calibration(self) -> bool:
        """Whether the system, as configured, learns from a calibration trace (its registry entry says)."""
        return entry_of(self.system).needs_calibration(self.system)

    def engine(self, trace: RoutingTrace | None = None) -> OffloadEngine:
        engine = OffloadEngine(self.system, self.geometry, self.budget.experts_per_layer, self.cost, trace=trace,
                               topology=self.topology, budget_scope=self.budget.scope)
        if self.measures:
            engine.ledger.track_phases()
        return engine


def setup_run(cfg: HarnessConfig, geometry: MoEGeometry) -> RunSetup:
    system = system_from_config(cfg.system)
    budget = resolve_budget(cfg.budget, geometry, cfg.model.entry.capabilities.paper_budgets)
    hardware = load_hardware(cfg.hardware, geometry)
    return RunSetup(system, geometry, budget, hardware, CostModel(geometry, hardware), build_topology(cfg.topology),
                    measures=wants_dali_measures(cfg), system_figures=wants_measures(cfg))


def build_result(cfg: HarnessConfig, setup: RunSetup, engine: OffloadEngine, counts: dict[str, Any],
                 clock: dict[str, float], identity: RunIdentity, trace: RoutingTrace | None = None) -> RunResult:
    """The result shared by live and replay runs: `identity` says how the run ran (source,
    weights, checkpoint, backend or trace); the rest comes from the config and the engine.
    `trace`: the routing the run decoded or replayed (DALI's measures read it)."""
    summary = engine.summary()
    step_series = summary.pop("step_series")
    modeled_s = summary["modeled_time_s"]
    metrics: dict[str, Any] = {
        "tokens_per_s": counts["generated_tokens"] / modeled_s if modeled_s > 0 else 0.0,
        "experts_per_layer_derived": setup.budget.derived_experts_per_layer,
        "budget_gb": setup.budget.gpu_gb,
        **{k: v for k, v in summary.items() if is_number(v)},  # experts_per_layer: the engine's B (the budget's)
    }
    metrics.update(phase_figures(step_series, counts["prompts"]))
    if setup.measures:
        metrics.update(measure_figures(engine.ledger.measures(), trace, setup.budget.experts_per_layer,
                                       setup.geometry.num_experts_per_tok, replacement_horizon(cfg.system)))
    if setup.system_figures:
        metrics.update(system_figures(setup.system))
    for key, value in counts.items():
        if key in metrics:
            raise DuplicateMetricError(f"run count {key!r} is also an engine metric; rename one of them")
        metrics[key] = value
    identity.system, identity.model = setup.system.name, cfg.model.name
    identity.hardware, identity.decode_cache = setup.hardware.name, cfg.decode.cache
    result = RunResult(identity=identity, config=cfg.as_dict(), budget=setup.budget.as_dict(), metrics=metrics,
                       system_report=setup.system.report(), timing=Timing("modeled", dict(clock)),
                       versions=versions(), step_series=step_series)
    result.cost_breakdown = cost_breakdown(engine.ledger.cost_rows(), [s["kind"] for s in step_series])
    result.hardware_estimates = setup.hardware.estimates()
    result.flat_metrics()  # a key reported twice is an error now, before anything is written
    return result


def phase_figures(step_series: list[dict[str, Any]], prompts: int) -> dict[str, float]:
    """An autoregressive run's prefill and decode apart (docs/model-families.md): the
    modeled seconds of each phase, the time to first token (the prefill forward, which
    yields the first token; mean over prompts) and the time per output token (a decode
    forward yields one). Runs without decode forwards (block diffusion) report none."""
    prefill = [p["modeled_latency_s"] for p in step_series if p["kind"] == "prefill"]
    decode = [p["modeled_latency_s"] for p in step_series if p["kind"] == "decode"]
    if not decode:
        return {}
    prefill_s, decode_s = sum(prefill), sum(decode)
    # one prefill forward per prompt, or per batch of prompts served in lock-step (workload.batch)
    return {"time_prefill_s": prefill_s, "time_decode_s": decode_s,
            "ttft_s": prefill_s / max(1, len(prefill) or prompts), "tpot_s": decode_s / len(decode)}


def versions() -> dict[str, str]:
    """Software versions and the machine (docs/result-schema.md, `versions`)."""
    return {
        "harness": harness.__version__, "code": code_version(), "python": platform.python_version(),
        "torch": torch.__version__, "hydra": hydra.__version__, "transformers": installed_version("transformers"),
        "numpy": numpy.__version__, "numba": numba.__version__, "mlflow": installed_version("mlflow"),
        "machine": platform.node(), **machine_environment(),
    }


def installed_version(package: str) -> str:
    """A package's version from its metadata, without importing it (MLflow and transformers take seconds)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


