"""What tells runs apart in a report: rows keyed by every setting that differs within the
runs read, system columns labelled by every option that differs between runs of that
system, and one run per key (the newer, with a warning naming the older).

A report never merges runs with different settings: the fixed row keys (model, gen_length,
block_length, budget) are always there, and every other setting of `records.run_settings`
(budget.gpu_gb under budget=custom, the workload, the weights, decode.threshold,
budget.scope, hardware, timing, ...) becomes a row key, shown as a column, as soon as two
runs disagree on it. A system's own options (system.tau, system.migration, ...) label its
column instead (`tide (tau=4)`; an option at its default is not named), so that the
systems of one row stay comparable side by side; system.overlap keeps its older label
(`tide_sequential`). Runs that agree on every
setting and option are the same measurement: the newer one is used and a warning names the
older, so nothing disappears without a word.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import pandas as pd

from harness.results.records import ROW_KEYS, setting_text
from systems.registry import SYSTEM_CONFIGS

Record = dict[str, Any]
CELL_PARTS = ("gen_length", "budget")  # a cell's label shows them: gen_length-B-budget
UNSET = "(unset)"  # a setting a run does not record (an older result.json)


@dataclass
class Keyed:
    """The report's runs, one per (row key, system column), and how they were keyed."""

    frame: pd.DataFrame  # one row per run kept; the key columns hold the settings as text
    keys: list[str]  # ROW_KEYS + the differing settings, in that order
    settings: list[str] = field(default_factory=list)  # the differing settings alone
    warnings: list[str] = field(default_factory=list)  # one line per set of same-key runs


def as_keyed(runs: Keyed | list[Record]) -> Keyed:
    """Runs as the report keys them: a Keyed as it is, records keyed here."""
    return runs if isinstance(runs, Keyed) else keyed_runs(runs)


def differing_settings(records: list[Record]) -> list[str]:
    """The settings (records' `settings`) whose values are not the same in every run, sorted;
    a budget.* setting that the budget's name decides (budget.gpu_gb of 10GB and 18GB: one
    value per name) is no setting of its own, the budget column says it already."""
    values: dict[str, set[str]] = defaultdict(set)
    per_budget: dict[tuple[str, str], set[str]] = defaultdict(set)
    names = {k for r in records for k in (r.get("settings") or {})}
    for r in records:
        for name in names:
            value = (r.get("settings") or {}).get(name, UNSET)
            values[name].add(value)
            per_budget[(name, str(r.get("budget")))].add(value)
    decided = {name for name in names if name.startswith("budget.")
               and all(len(seen) == 1 for (n, _), seen in per_budget.items() if n == name)}
    return sorted(k for k, seen in values.items() if len(seen) > 1 and k not in decided)


def option_defaults(system: str | None) -> dict[str, str]:
    """A system's option defaults as setting texts (systems/registry.py's config dataclasses)."""
    config = SYSTEM_CONFIGS.get(str(system))
    if config is None:
        return {}
    return {f.name: setting_text(f.default) for f in fields(config) if f.default is not MISSING}


def column_labels(records: list[Record]) -> list[str]:
    """Each run's system column: its system label plus, in parentheses, the options that
    differ between the runs sharing that label and that this run does not leave at their
    default (`tide`, `tide (tau=4)`, `tide (migration=async, tau=4)`)."""
    by_label: dict[str, list[Mapping[str, str]]] = defaultdict(list)
    for r in records:
        by_label[str(r.get("system"))].append(r.get("system_options") or {})
    differing: dict[str, list[str]] = {}
    for label, options in by_label.items():
        names = sorted({k for o in options for k in o})
        differing[label] = [k for k in names if len({o.get(k, UNSET) for o in options}) > 1]
    labels = []
    for r in records:
        label, options = str(r.get("system")), r.get("system_options") or {}
        defaults = option_defaults(r.get("system_name") or label)
        shown = ", ".join(f"{k}={options.get(k, UNSET)}" for k in differing[label]
                          if options.get(k, UNSET) != defaults.get(k))
        labels.append(f"{label} ({shown})" if shown else label)
    return labels


def keyed_runs(records: list[Record]) -> Keyed:
    """The records as a frame with one run per (row key, system column): the row keys are the
    fixed ones plus every differing setting, `system` is the column label, `system_label` the
    label without options (baselines are found by it) and `system_name` the bare system."""
    settings = differing_settings(records)
    df = pd.DataFrame(records)
    if df.empty:
        return Keyed(df, list(ROW_KEYS), settings)
    df["system_name"] = df["system_name"].fillna(df["system"]) if "system_name" in df else df["system"]
    if "tau" in df:  # 4, "auto", None as they are: pandas would make 4.0 of a 4 beside a None
        df["tau"] = pd.Series([r.get("tau") for r in records], index=df.index, dtype=object)
    df["system_label"] = df["system"]  # tide, tide_sequential: the label before any options
    df["system"] = column_labels(records)
    for name in settings:
        df[name] = [(r.get("settings") or {}).get(name, UNSET) for r in records]
    keys = [*ROW_KEYS, *settings]
    df[keys] = df[keys].astype(object).where(df[keys].notna(), "?")
    kept, warnings = newest_per_key(df, [*keys, "system"])
    return Keyed(kept, keys, settings, warnings)


def newest_per_key(df: pd.DataFrame, key: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """One run per key: the newest (largest `order`); one warning per key that had several,
    naming the run used and the older ones left out."""
    ranked = df.sort_values("order", kind="stable")
    warnings = []
    for values, group in ranked.groupby(key, sort=False, dropna=False):
        if len(group) < 2:
            continue
        newest, older = group.iloc[-1], group.iloc[:-1]
        where = ", ".join(f"{k}={v}" for k, v in zip(key, values, strict=True))
        warnings.append(f"warning: {len(group)} runs with the same settings ({where}); using the newer "
                        f"{newest['source']}, leaving out the older {', '.join(map(str, older['source']))}")
    return ranked.drop_duplicates(key, keep="last"), warnings


def experts_per_row(keyed: Keyed) -> dict[tuple[Any, ...], Any]:
    """Row key -> B, the experts per layer its runs held (the largest, if they differ)."""
    df = keyed.frame
    if df.empty or "experts" not in df:
        return {}
    held = pd.to_numeric(df["experts"], errors="coerce")
    best = held.groupby([df[k] for k in keyed.keys]).max().dropna()
    return {(k if isinstance(k, tuple) else (k,)): int(v) for k, v in best.items()}


def cell_headers(keyed: Keyed, labels: Mapping[str, str] | None = None) -> list[str]:
    """The columns that name a row in every table of the report: `cell` (gen_length-B-budget,
    the paper's label) and each other row key (model, block_length and the differing settings)."""
    return ["cell", *((labels or {}).get(k, k) for k in keyed.keys if k not in CELL_PARTS)]


def cell_values(keyed: Keyed, row: Mapping[str, Any], experts: Mapping[tuple[Any, ...], Any] | None = None
                ) -> list[str]:
    """A run's (or row's) values under cell_headers: `256-64-10GB`, then the other row keys."""
    values = tuple(row[k] for k in keyed.keys)
    b = (experts if experts is not None else experts_per_row(keyed)).get(values, "?")
    return [f"{row['gen_length']}-{b}-{row['budget']}", *(str(row[k]) for k in keyed.keys if k not in CELL_PARTS)]


def rows_of(keyed: Keyed) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """The report's rows in the order the tables list them: (row key values, its runs)."""
    if keyed.frame.empty:
        return []
    groups = keyed.frame.groupby(keyed.keys, sort=False, dropna=False)
    out = [((v if isinstance(v, tuple) else (v,)), g) for v, g in groups]
    return sorted(out, key=lambda vg: tuple(_sortable(k, v) for k, v in zip(keyed.keys, vg[0], strict=True)))


def _sortable(key: str, value: Any) -> tuple[float, str]:
    if key in ("budget", "gen_length", "block_length"):  # 10GB < 18GB < custom; 32 < 256
        found = re.match(r"([\d.]+)", str(value))
        return (float(found.group(1)) if found else math.inf, str(value))
    return (0.0, str(value))


def key_label(keys: list[str], values: tuple[Any, ...] | Any) -> str:
    """`model=mini, budget=10GB, budget.gpu_gb=12.0` for a panel or figure title."""
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
