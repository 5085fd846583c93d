"""DALI's measures on a run (issue 27; docs/dali-and-gem.md): whether a run computes them,
and their figures for result.json's metrics (and so MLflow and the report).

Two sources: the ledger's per-phase accounts (busy shares and the run's own expert hit
rate, harness/accounting/phases.py) and the routing trace the run decoded or replayed
(predictor precision and recall, LRU/LFU/workload cache replays at the run's B,
harness/traces/dali_measures.py). A live run that records no trace keeps one in memory.

`measures: null` (the default) computes them for the models whose entry says so (the
transformers families: DALI's setting, prefill and token-by-token decode; harness/zoo), not
for LLaDA2 runs, whose results (the golden grid) stay as they were; `measures=true`
computes them for any offloading run, `measures=false` for none. Expert-parallel runs
(topology=multi) have no DALI measures (nothing is offloaded); a gem run reports GEM's
profiling cost instead.
"""

from __future__ import annotations

from typing import Any

from harness.job.config import HarnessConfig
from harness.placement.trace import RoutingTrace
from harness.traces.dali_measures import measures_of_trace
from systems.dali import DaliConfig
from systems.gem import Gem


def wants_measures(cfg: HarnessConfig) -> bool:
    """Whether this run computes the papers' measures (module docstring): DALI's on one
    GPU, GEM's profiling cost for gem."""
    return cfg.model.entry.capabilities.measures_by_default if cfg.measures is None else bool(cfg.measures)


def wants_dali_measures(cfg: HarnessConfig) -> bool:
    return wants_measures(cfg) and cfg.topology.name != "multi"


def gem_figures(system: Any) -> dict[str, float]:
    """GEM's profiling cost (systems/gem.py `profiling_cost`) for a gem run; none otherwise."""
    return system.profiling_cost() if isinstance(system, Gem) else {}


def replacement_horizon(system_config: Any) -> int:
    """The horizon of the time-correlation score the cache replay uses: the run's own
    (dali), else dali's default."""
    horizon = getattr(system_config, "horizon", None)
    return int(horizon) if isinstance(horizon, int) and not isinstance(horizon, bool) else DaliConfig.horizon


def measure_figures(ledger_measures: dict[str, float], trace: RoutingTrace | None, capacity: int, top_k: int,
                    horizon: int) -> dict[str, float]:
    """The ledger's figures, then the trace's (none without a trace)."""
    figures = dict(ledger_measures)
    if trace is not None and len(trace):
        figures.update(measures_of_trace(trace, capacity, top_k, horizon))
    return figures
