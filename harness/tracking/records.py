"""Records: one flat row per finished run (what identifies it, its headline metrics,
its step series), the one-line summary of a record, and the rules that shape a table of
records (row keys, one run per cell, the systems' order). harness/report/report.py builds the
tables and plots from them, harness/report/plots.py draws them, harness/tracking/resume.py and the sweep
callback print the line; a leaf below all three."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.tracking.result import RunResult
from systems.registry import SYSTEM_CONFIGS

ROW_KEYS = ["model", "gen_length", "block_length", "budget"]

OPTIONAL_ROW_KEYS = ["decode_cache", "hardware"]

SYSTEM_ORDER = ["gpu_only", "fiddler", "mixtral_offload", "dali", "tide", "tide-sequential", "tide_adaptive", "oracle",
                "ep_linear", "gem"]

RECORD_METRICS = ["tokens_per_s", "wall_tokens_per_s", "miss_rate", "io_gb", "cpu_expert_tokens", "tau_star",
                  "lossless", "token_match_rate", "experts_per_layer", "generated_tokens", "prompts"]

SWEEP_FILES = ("sweep_summary.csv", "sweep_summary.md", "throughput.png")


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def system_label(name: str | None, system_config: Mapping[str, Any]) -> str | None:
    """The report's name for a system: its own, or `<name>-sequential` / `<name>-overlapped`
    when it was charged against its original's overlap (systems/registry.py defaults)."""
    overlap = system_config.get("overlap")
    if isinstance(overlap, str):  # an MLflow param
        overlap = {"true": True, "false": False}.get(overlap.strip().lower())
    if name is None or not isinstance(overlap, bool):
        return name
    default = getattr(SYSTEM_CONFIGS.get(name), "overlap", None)
    if default is None or overlap == default:
        return name
    return f"{name}-overlapped" if overlap else f"{name}-sequential"


def record_from_result(result: RunResult, source: str, status: str = "ok", order: float = 0.0
                       ) -> dict[str, Any]:
    """One flat row per result: what identifies the run, the headline metrics, the step series."""
    ident = result.identity
    decode, system = result.config.get("decode") or {}, result.config.get("system") or {}
    metrics = result.flat_metrics()
    tokens_per_s = metrics.get("tokens_per_s", metrics.get("wall_tokens_per_s"))
    record = {
        "source": source, "status": status, "order": order,
        "system": system_label(ident.system or system.get("name"), system), "model": ident.model,
        "experts": result.budget.get("experts_per_layer"),
        "gen_length": decode.get("gen_length"), "block_length": decode.get("block_length"),
        "budget": result.budget_name,
        "tau": _int(system.get("tau")), "migration": system.get("migration"),
        "timing": result.timing.kind if "tokens_per_s" in metrics else "wall",
        "decode_cache": ident.decode_cache or decode.get("cache"),
        "hardware": ident.hardware, "weights": ident.weights,
        "step_series": result.step_series,
        "routing": result.routing,
        "cost_breakdown": result.cost_breakdown,
        "trace": ident.trace,  # a replay's trace file (routing statistics in the report)
        "tau_curve": result.system_report.get("lat_curve"),  # TIDE's objective over tau = 1..T
    }
    record.update({k: _num(metrics.get(k)) for k in RECORD_METRICS})
    record["tokens_per_s"] = _num(tokens_per_s)
    return record


def compact_line(record: Mapping[str, Any], label: str = "") -> str:
    """One line per finished job of a sweep."""
    head = f"[{record['status']}] {label}: " if label else f"[{record['status']}] "
    tau = f" tau*={record['tau_star']:g}" if not math.isnan(record["tau_star"]) else ""
    return (f"{head}{record['system']} budget={record['budget']} model={record['model']} | "
            f"{record['tokens_per_s']:.1f} tok/s ({record['timing']}) | miss {_pct(record['miss_rate'])} | "
            f"io {record['io_gb']:.2f} GB{tau} | lossless={_yes_no(record['lossless'])}")


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _yes_no(x: float) -> str:
    return "-" if math.isnan(x) else ("yes" if x >= 1 else "no")


def _int(value: Any) -> Any:
    """'4' -> 4 (config values such as system.tau are strings: 'auto', 'random', '4')."""
    return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value


def row_keys(df: pd.DataFrame) -> list[str]:
    """The fixed row keys, plus the optional ones that take more than one value here."""
    return ROW_KEYS + [k for k in OPTIONAL_ROW_KEYS if k in df and df[k].nunique(dropna=False) > 1]


def one_per_cell(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    fixed_tau = (df["system"] == "tide") & df["tau"].map(lambda t: isinstance(t, int))
    ranked = df.assign(_preferred=~fixed_tau).sort_values(["_preferred", "order"], kind="stable")
    return ranked.drop_duplicates([*keys, "system"], keep="last").drop(columns="_preferred")


def system_order(systems: list[str]) -> list[str]:
    return [s for s in SYSTEM_ORDER if s in systems] + sorted(s for s in systems if s not in SYSTEM_ORDER)
