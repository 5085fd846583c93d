"""Comparison plots (PNG, matplotlib Agg) from report records (`harness.report.tables`).

- throughput by system and budget: grouped bars, one panel per (model, gen, block);
- tau sweeps (tide runs with different integer tau): throughput and miss rate against
  tau, with tau* (the solver's choice, from a tau=auto run) marked;
- miss rate per denoising step within a block, averaged over blocks, one line per system.

Every title says "(modeled)" when the throughput comes from the cost model.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.results.records import one_per_cell, row_keys, system_order

Record = dict[str, Any]


def timing_note(records: list[Record]) -> str:
    timings = sorted({str(r.get("timing")) for r in records})
    if timings == ["modeled"]:
        return " (modeled)"
    return f" (timing: {', '.join(timings)})" if len(timings) > 1 else f" ({timings[0]})" if timings else ""


def _slug(values: tuple[Any, ...]) -> str:
    return re.sub(r"[^\w.-]+", "_", "_".join(str(v) for v in values)).strip("_")


def _budget_order(budget: Any) -> tuple[float, str]:
    found = re.match(r"([\d.]+)", str(budget))
    return (float(found.group(1)) if found else math.inf, str(budget))


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only: no display on servers and in
    tests), imported when a plot is drawn: every run imports the report's modules through
    the sweep callback, and only a sweep's end draws."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def throughput_by_budget(records: list[Record], path: Path) -> Path | None:
    import pandas as pd

    df = pd.DataFrame(records)
    if df.empty or df["tokens_per_s"].isna().all():
        return None
    keys = row_keys(df)
    df = one_per_cell(df.assign(**{k: df[k].fillna("?") for k in keys}), keys)
    panel_keys = [k for k in keys if k != "budget"]
    panels = list(df.groupby(panel_keys, sort=True))
    fig, axes = pyplot().subplots(len(panels), 1, figsize=(8, 3.6 * len(panels)), squeeze=False)
    for ax, (panel, part) in zip(axes[:, 0], panels, strict=True):
        budgets = sorted(part["budget"].unique(), key=_budget_order)
        systems = system_order(list(part["system"].unique()))
        width = 0.8 / len(systems)
        for i, system in enumerate(systems):
            values = [part[(part["system"] == system) & (part["budget"] == b)]["tokens_per_s"].max() for b in budgets]
            ax.bar([j + i * width for j in range(len(budgets))], values, width, label=system)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(budgets))], [str(b) for b in budgets])
        ax.set_xlabel("GPU memory budget")
        ax.set_ylabel("throughput (tokens/s)")
        ax.set_title(", ".join(f"{k}={v}" for k, v in zip(panel_keys, panel, strict=True)), fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(f"Throughput by system and budget{timing_note(records)}")
    return _save(fig, path)


def _tau_groups(records: list[Record]) -> dict[tuple[Any, ...], list[Record]]:
    groups: dict[tuple[Any, ...], list[Record]] = defaultdict(list)
    for r in records:
        if r.get("system") == "tide":
            groups[(r["model"], r["gen_length"], r["block_length"], r["budget"], r.get("decode_cache"),
                    r.get("migration"))].append(r)
    return groups


def tau_sweeps(records: list[Record], out: Path) -> list[Path]:
    """One figure per group of tide runs that tried at least two integer taus."""
    written = []
    for group, runs in _tau_groups(records).items():
        fixed = sorted((r for r in runs if isinstance(r.get("tau"), int)), key=lambda r: (r["tau"], r["order"]))
        by_tau = {r["tau"]: r for r in fixed}  # the latest run per tau
        if len(by_tau) < 2:
            continue
        auto = [r for r in runs if not isinstance(r.get("tau"), int) and not math.isnan(r["tau_star"])]
        tau_star = max(auto, key=lambda r: r["order"])["tau_star"] if auto else None
        taus = sorted(by_tau)
        fig, (top, bottom) = pyplot().subplots(2, 1, figsize=(7, 6), sharex=True)
        top.plot(taus, [by_tau[t]["tokens_per_s"] for t in taus], marker="o")
        top.set_ylabel("throughput (tokens/s)")
        bottom.plot(taus, [100 * by_tau[t]["miss_rate"] for t in taus], marker="o", color="tab:red")
        bottom.set_ylabel("miss rate (%)")
        bottom.set_xlabel("refresh interval tau (denoising steps)")
        if tau_star is not None:
            for ax in (top, bottom):
                ax.axvline(tau_star, linestyle="--", color="gray", label=f"tau* = {tau_star:g}")
            top.legend(fontsize=8)
        names = ("model", "gen", "block", "budget", "cache", "migration")
        fig.suptitle(f"TIDE tau sweep{timing_note(fixed)}\n"
                     + ", ".join(f"{n}={v}" for n, v in zip(names, group, strict=True)), fontsize=10)
        written.append(_save(fig, out / f"tau_sweep_{_slug(group)}.png"))
    return written


def miss_by_step_in_block(series: list[dict[str, Any]]) -> dict[int, float]:
    """Mean miss rate of denoising steps, by step index within their block."""
    sums: dict[int, list[float]] = defaultdict(list)
    for point in series:
        if point.get("kind", "denoise") == "denoise" and isinstance(point.get("miss_rate"), int | float):
            sums[int(point["step"])].append(float(point["miss_rate"]))
    return {step: sum(v) / len(v) for step, v in sorted(sums.items())}


def miss_per_step(records: list[Record], out: Path) -> list[Path]:
    """One figure per (model, gen, block, budget): a line per system that recorded a step series."""
    import pandas as pd

    df = pd.DataFrame(records)
    if df.empty:
        return []
    keys = row_keys(df)
    df = one_per_cell(df.assign(**{k: df[k].fillna("?") for k in keys}), keys)
    written = []
    for group, part in df.groupby(keys, sort=True):
        curves = {r["system"]: miss_by_step_in_block(r["step_series"]) for _, r in part.iterrows()}
        curves = {s: c for s, c in curves.items() if c}
        if not curves:
            continue
        fig, ax = pyplot().subplots(figsize=(7, 4))
        for system in system_order(list(curves)):
            ax.plot(list(curves[system]), [100 * v for v in curves[system].values()], marker=".", label=system)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("denoising step within the block")
        ax.set_ylabel("miss rate (%, mean over blocks)")
        ax.legend(fontsize=8)
        ax.set_title(f"Miss rate per step{timing_note(part.to_dict('records'))}\n"
                     + ", ".join(f"{k}={v}" for k, v in zip(keys, group, strict=True)), fontsize=10)
        written.append(_save(fig, out / f"miss_per_step_{_slug(group)}.png"))
    return written
