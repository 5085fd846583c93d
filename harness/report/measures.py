"""The report's section on DALI's measures (harness/job/measures.py; docs/dali-and-gem.md):
for each row of the report (its cell and every differing setting, as the table names it), one line per
system column with its busy shares and expert hit rate, per phase (the forwards' kinds the
runs have: prefill and decode for autoregressive models, denoise and commit too for block
diffusion); then
one line per row with the trace's predictor and cache-replay figures, which every system
replayed over that trace shares (they compare predictors and replacement rules, not
systems). All figures are modeled."""

from __future__ import annotations

import math
from typing import Any

from harness.report.keys import Keyed, as_keyed, cell_headers, cell_values, experts_per_row, rows_of
from harness.report.markdown import pipe_table
from harness.results.records import system_order

PHASES = ("prefill", "decode", "denoise", "commit")  # the order columns take; only present ones shown
SYSTEM_FIGURES = [("cpu_side_share", "CPU side (GPU side with copies)"),
                  ("cpu_expert_share", "CPU share of expert compute"), ("gpu_busy_share", "GPU busy"),
                  ("cpu_busy_share", "CPU busy"), ("expert_hit_rate", "expert hit rate")]
TRACE_FIGURES = [("prefetch_recall_residual", "residual recall"),
                 ("prefetch_precision_residual", "residual precision"),
                 ("prefetch_recall_next_gate", "next-gate recall"),
                 ("prefetch_recall_token_count", "token-count recall"),
                 ("cache_hit_rate_workload", "cache hit: workload"), ("cache_hit_rate_lru", "LRU"),
                 ("cache_hit_rate_lfu", "LFU")]


def _pct(value: Any) -> str:
    return "-" if not isinstance(value, int | float) or math.isnan(value) else f"{100 * value:.1f}%"


def phases_in(measures: list[dict[str, float]]) -> list[str]:
    """The phases any of these runs reports (PHASES order)."""
    return [p for p in PHASES if any(k.endswith(f"_{p}") for m in measures for k in m)]


def by_phase(measures: dict[str, float], base: str, phases_shown: list[str] | tuple[str, ...] = PHASES[:2]) -> str:
    """`run (phase / phase ...)`, or the run's figure alone where the run has no phases."""
    phases = [measures.get(f"{base}_{p}") for p in phases_shown]
    whole = _pct(measures.get(base))
    if all(v is None for v in phases):
        return whole
    return f"{whole} ({' / '.join(_pct(v) for v in phases)})"


def measures_markdown(runs: Keyed | list[dict[str, Any]]) -> str:
    """The section; empty when no run reports DALI's measures."""
    keyed = as_keyed(runs)
    if keyed.frame.empty or not any(bool(m) for m in keyed.frame.get("measures", [])):
        return ""
    experts = experts_per_row(keyed)
    shown = phases_in([m for m in keyed.frame["measures"] if m])
    per_system: list[list[str]] = []
    per_trace: list[list[str]] = []
    for _, group in rows_of(keyed):
        by_label = {str(r["system"]): r for r in group.to_dict("records") if r.get("measures")}
        if not by_label:
            continue
        labels = system_order(list(by_label))
        cell = cell_values(keyed, by_label[labels[0]], experts)
        for label in labels:
            m = by_label[label]["measures"]
            per_system.append([*cell, label, *(by_phase(m, base, shown) for base, _ in SYSTEM_FIGURES)])
        first = by_label[labels[0]]["measures"]
        per_trace.append([*cell, *(by_phase(first, base, shown) for base, _ in TRACE_FIGURES)])
    headers = cell_headers(keyed, {"gen_length": "gen", "block_length": "block"})
    return (f"\n## DALI's measures (modeled; run ({' / '.join(shown)}))\n\n"
            + pipe_table([*headers, "system", *(title for _, title in SYSTEM_FIGURES)], per_system)
            + "\nOver the routing trace (the same for every system of a row): next-layer prediction of "
              "top_k experts, and a B-expert cache per layer under three replacement rules.\n\n"
            + pipe_table([*headers, *(title for _, title in TRACE_FIGURES)], per_trace))
