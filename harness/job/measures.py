"""DALI's measures on a run (docs/dali-and-gem.md): whether a run computes them, and their
figures for result.json's metrics (and so MLflow and the report).

Two sources: the ledger's per-phase accounts (busy shares and the run's own expert hit
rate, harness/accounting/phases.py) and the routing trace the run decoded or replayed
(predictor precision and recall, LRU/LFU/workload cache replays at the run's B,
harness/traces/dali_measures.py). A live run that records no trace keeps one in memory.

`measures: null` (the default) computes them for the models whose entry says so (the
transformers families: DALI's setting, prefill and token-by-token decode; harness/zoo), not
for LLaDA2 runs, whose results (the golden grid) stay as they were; `measures=true`
computes them for any offloading run, `measures=false` for none. Expert-parallel runs
(topology=multi) have no DALI measures (nothing is offloaded). A run that computes the
measures also reports the figures its system's entry adds (`SystemEntry.figures`: GEM's
profiling cost), and the cache replay scores the workload over the horizon its system's entry
reads from its config (`SystemEntry.measure_horizon`: DALI's), else the replay's default.
"""

from __future__ import annotations

from typing import Any

from harness.job.config import HarnessConfig
from harness.placement.system import System
from harness.placement.trace import RoutingTrace
from harness.traces.dali_measures import DEFAULT_HORIZON, measures_of_trace
from systems.registry import entry_named, entry_of


def wants_measures(cfg: HarnessConfig) -> bool:
    """Whether this run computes the papers' measures (module docstring): DALI's on one
    GPU, and the figures the system's entry adds."""
    return cfg.model.entry.capabilities.measures_by_default if cfg.measures is None else bool(cfg.measures)


def wants_dali_measures(cfg: HarnessConfig) -> bool:
    return wants_measures(cfg) and cfg.topology.name != "multi"


def system_figures(system: System) -> dict[str, float]:
    """The figures the system's entry adds to a run's (GEM's profiling cost); none otherwise."""
    figures = entry_of(system).figures
    return figures(system) if figures is not None else {}


def replacement_horizon(system_config: Any) -> int:
    """The horizon of the time-correlation score the cache replay uses: the run's own where its
    system's entry reads one from its config (dali), else the replay's default."""
    horizon = entry_named(system_config.name).measure_horizon
    return horizon(system_config) if horizon is not None else DEFAULT_HORIZON


def measure_figures(ledger_measures: dict[str, float], trace: RoutingTrace | None, capacity: int, top_k: int,
                    horizon: int) -> dict[str, float]:
    """The ledger's figures, then the trace's (none without a trace)."""
    figures = dict(ledger_measures)
    if trace is not None and len(trace):
        figures.update(measures_of_trace(trace, capacity, top_k, horizon))
    return figures
