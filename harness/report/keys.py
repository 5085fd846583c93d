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

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import pandas as pd

from harness.results.records import ROW_KEYS, setting_text
from systems.registry import SYSTEM_CONFIGS

Record = dict[str, Any]
UNSET = "(unset)"  # a setting a run does not record (an older result.json)


@dataclass
class Keyed:
    """The report's runs, one per (row key, system column), and how they were keyed."""

    frame: pd.DataFrame  # one row per run kept; the key columns hold the settings as text
    keys: list[str]  # ROW_KEYS + the differing settings, in that order
    settings: list[str] = field(default_factory=list)  # the differing settings alone
    warnings: list[str] = field(default_factory=list)  # one line per set of same-key runs


def differing_settings(records: list[Record]) -> list[str]:
    """The settings (records' `settings`) whose values are not the same in every run, sorted."""
    values: dict[str, set[str]] = defaultdict(set)
    names = {k for r in records for k in (r.get("settings") or {})}
    for r in records:
        for name in names:
            values[name].add((r.get("settings") or {}).get(name, UNSET))
    return sorted(k for k, seen in values.items() if len(seen) > 1)


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


def key_label(keys: list[str], values: tuple[Any, ...] | Any) -> str:
    """`model=mini, budget=10GB, budget.gpu_gb=12.0` for a panel or figure title."""
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
