"""The report's section on DALI's measures (harness/job/measures.py; docs/dali-and-gem.md):
for each row of the report (model, budget and every differing setting), one line per
system column with its busy shares and expert hit rate, per phase (the forwards' kinds the
runs have: prefill and decode for autoregressive models, denoise and commit too for block
diffusion); then
one line per row with the trace's predictor and cache-replay figures, which every system
replayed over that trace shares (they compare predictors and replacement rules, not
systems). All figures are modeled."""

from __future__ import annotations

import math
from typing import Any

from harness.report.keys import key_label, keyed_runs
from harness.results.records import system_order

PHASES = ("prefill", "decode", "denoise", "commit")  # the order columns take; only present ones shown
SYSTEM_FIGURES = [("cpu_side_share", "CPU side (GPU side with copies)"),
                  ("cpu_expert_share", "CPU share of expert compute"), ("gpu_busy_share", "GPU busy"),
                  ("cpu_busy_share", "CPU busy"), ("expert_hit_rate", "expert hit rate")]
TRACE_FIGURES = [("prefetch_recall_residual", "residual recall"),
                 ("prefetch_precision_residual", "residual precision"),
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


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def measures_markdown(records: list[dict[str, Any]]) -> str:
    """The section; empty when no run reports DALI's measures."""
    with_measures = [r for r in records if r.get("measures")]
    if not with_measures:
        return ""
    keyed = keyed_runs(with_measures)
    frame, keys = keyed.frame, keyed.keys
    shown = phases_in([r["measures"] for r in with_measures])
    lines = ["", f"## DALI's measures (modeled; run ({' / '.join(shown)}))", ""]
    per_system: list[list[str]] = []
    per_trace: list[list[str]] = []
    for values, group in frame.groupby(keys, sort=True):
        row = key_label(keys, values)
        by_label = {str(r["system"]): r for _, r in group.iterrows()}
        for label in system_order(list(by_label)):
            m = by_label[label]["measures"]
            per_system.append([row, label, *(by_phase(m, base, shown) for base, _ in SYSTEM_FIGURES)])
        first = by_label[system_order(list(by_label))[0]]["measures"]
        per_trace.append([row, *(by_phase(first, base, shown) for base, _ in TRACE_FIGURES)])
    lines += _table(["row", "system", *(title for _, title in SYSTEM_FIGURES)], per_system)
    lines += ["", "Over the routing trace (the same for every system of a row): next-layer prediction of "
                  "top_k experts, and a B-expert cache per layer under three replacement rules.", ""]
    lines += _table(["row", *(title for _, title in TRACE_FIGURES)], per_trace)
    return "\n".join(lines) + "\n"
