"""Comparison figures (matplotlib Agg) from report records (`harness.report.tables`).

- throughput by system and budget: budgets side by side along x, the systems of each cell
  side by side within it, one panel per value of the other row keys;
- tau sweeps (tide runs with different integer tau): throughput and miss rate against
  tau, with tau* (the solver's choice, from a tau=auto run) marked;
- miss rate per denoising step within a block, averaged over blocks, one line per system.

Camera-ready: every figure is written as PNG (300 dpi), PDF and SVG side by side; error
bars are the 95% confidence interval of the run's mean over its prompts (Student t), or with
errors="sd" the prompts' spread (harness/report/uncertainty.py; each prompt's modeled
tokens/s and miss rate from the run's per-prompt step series; none where a run has fewer
than two prompts or no per-prompt series), the caption says which and that the interval is
over prompts, not repeated runs; constrained layout and wrapped titles keep text apart
(tests/unit/test_plots.py checks a rendered figure); legends sit outside the axes; an axis
whose values are all powers of two (tau) is log2. Rows and columns are keyed as the report's
table (harness/report/keys.py), so a figure never merges runs with different settings.
Every title says "(modeled)" when the throughput comes from the cost model.
"""

from __future__ import annotations

import hashlib
import math
import re
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.report.keys import Keyed, as_keyed, key_label
from harness.report.uncertainty import caption, half_width
from harness.results.records import system_order

Record = dict[str, Any]
FORMATS = (".png", ".pdf", ".svg")
DPI = 300


def timing_note(records: list[Record]) -> str:
    timings = sorted({str(r.get("timing")) for r in records})
    if timings == ["modeled"]:
        return " (modeled)"
    return f" (timing: {', '.join(timings)})" if len(timings) > 1 else f" ({timings[0]})" if timings else ""


def _slug(values: tuple[Any, ...]) -> str:
    """A file name part for a row key; rows whose texts differ only in what a file name cannot
    hold (or beyond its first 100 characters) get a digest of the full key too."""
    raw = "_".join(str(v) for v in values)
    slug = re.sub(r"[^\w.-]+", "_", raw).strip("_")
    if slug == raw and len(slug) <= 100:
        return slug
    return f"{slug[:100]}_{hashlib.sha256(raw.encode()).hexdigest()[:8]}"


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

    plt.rcParams["svg.hashsalt"] = "harness"  # the same figure gives the same SVG
    return plt


def figure_files(png: Path) -> list[Path]:
    """The PNG, PDF and SVG of one figure."""
    return [png.with_suffix(s) for s in FORMATS]


def _save(fig: Any, path: Path) -> Path:
    """Write the figure as PNG (300 dpi), PDF and SVG; the bounding box takes in the legends
    outside the axes. Returns the PNG's path."""
    metadata = {".png": {}, ".pdf": {"CreationDate": None}, ".svg": {"Date": None}}
    for file in figure_files(path):
        fig.savefig(file, dpi=DPI, bbox_inches="tight", metadata=metadata[file.suffix])
    pyplot().close(fig)
    return path


def legend_outside(ax: Any, **kwargs: Any) -> None:
    """The legend to the right of the axes, never over the data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, **kwargs)


def powers_of_two(values: list[Any]) -> bool:
    """At least two distinct values, every one a positive integer power of two (1, 2, 4, ...)."""
    ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return len(ints) == len(values) and len(set(ints)) >= 2 and all(v > 0 and v & (v - 1) == 0 for v in ints)


def log2_axis(ax: Any, values: list[int]) -> None:
    """A log2 x axis ticked at the values themselves, labelled as plain integers."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


def spread(record: Record, metric: str) -> float:
    """The standard deviation of a metric across the run's prompts (NaN under two prompts)."""
    return half_width(record, metric, "sd")


def _errors(values: list[float]) -> list[float] | None:
    """Error bar half-lengths for matplotlib, None when no run has one."""
    return [0.0 if math.isnan(v) else v for v in values] if any(not math.isnan(v) for v in values) else None


def _wrapped(text: str, width: int = 90) -> str:
    return textwrap.fill(text, width=width, break_long_words=True, break_on_hyphens=False)


def throughput_by_budget(runs: Keyed | list[Record], path: Path, errors: str = "ci") -> Path | None:
    """Grouped bars: budgets side by side along x, the systems of each budget's cell side by
    side within it (one colour per system throughout); one panel per value of the row keys
    other than the budget (panels only for settings that are not the compared axis)."""
    keyed = as_keyed(runs)
    df = keyed.frame
    if df.empty or df["tokens_per_s"].isna().all():
        return None
    records = df.to_dict("records")
    panel_keys = [k for k in keyed.keys if k != "budget"]
    panels = list(df.groupby(panel_keys, sort=True))
    everyone = system_order(list(df["system"].unique()))
    colours = {s: f"C{i % 10}" for i, s in enumerate(everyone)}
    cells = max(len(part["budget"].unique()) * len(part["system"].unique()) for _, part in panels)
    plt = pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(7.0, 1.2 + 0.45 * cells), 1.2 + 3.2 * len(panels)),
                             squeeze=False, layout="constrained")
    for ax, (panel, part) in zip(axes[:, 0], panels, strict=True):
        budgets = sorted(part["budget"].unique(), key=_budget_order)
        systems = system_order(list(part["system"].unique()))
        width = 0.8 / len(systems)
        for i, system in enumerate(systems):
            rows = [part[(part["system"] == system) & (part["budget"] == b)] for b in budgets]
            values = [r["tokens_per_s"].iloc[0] if len(r) else math.nan for r in rows]
            bars = [half_width(r.iloc[0].to_dict(), "tokens_per_s", errors) if len(r) else math.nan for r in rows]
            ax.bar([j + i * width for j in range(len(budgets))], values, width, label=system, color=colours[system],
                   yerr=_errors(bars), capsize=2, error_kw={"elinewidth": 0.8})
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(budgets))], [str(b) for b in budgets])
        ax.set_ylim(bottom=0)  # an interval of a few prompts may reach below zero tokens/s: not drawn
        ax.set_xlabel("GPU memory budget")
        ax.set_ylabel("throughput (tokens/s)")
        ax.set_title(_wrapped(key_label(panel_keys, panel), 80), fontsize=8)
        legend_outside(ax)
    fig.suptitle(_wrapped(f"Throughput by system and budget{timing_note(records)}. {caption(errors, records)}"),
                 fontsize=9)
    return _save(fig, path)


def tau_sweeps(runs: Keyed | list[Record], out: Path, errors: str = "ci") -> list[Path]:
    """One figure per group of tide runs (same row key, same tide options but tau) that tried
    at least two integer taus; tau* from the group's latest tau=auto run."""
    keyed = as_keyed(runs)
    df = keyed.frame
    if df.empty:
        return []
    groups: dict[tuple[Any, ...], list[Record]] = defaultdict(list)
    for run in df[df["system_name"] == "tide"].to_dict("records"):
        others = tuple(sorted((k, v) for k, v in (run.get("system_options") or {}).items() if k != "tau"))
        groups[(*(run[k] for k in keyed.keys), run["system_label"], others)].append(run)
    written = []
    for group, runs in groups.items():
        by_tau = {r["tau"]: r for r in sorted(runs, key=lambda r: r["order"]) if isinstance(r.get("tau"), int)}
        if len(by_tau) < 2:
            continue
        auto = [r for r in runs if not isinstance(r.get("tau"), int) and not math.isnan(r["tau_star"])]
        tau_star = max(auto, key=lambda r: r["order"])["tau_star"] if auto else None
        written.append(_tau_figure(by_tau, tau_star, key_label(keyed.keys, group[: len(keyed.keys)]),
                                   group, out, errors))
    return written


def _tau_figure(by_tau: dict[int, Record], tau_star: float | None, title: str, group: tuple[Any, ...],
                out: Path, errors: str = "ci") -> Path:
    taus = sorted(by_tau)
    runs = [by_tau[t] for t in taus]
    fig, (top, bottom) = pyplot().subplots(2, 1, figsize=(7, 6.5), sharex=True, layout="constrained")
    top.errorbar(taus, [r["tokens_per_s"] for r in runs],
                 yerr=_errors([half_width(r, "tokens_per_s", errors) for r in runs]),
                 marker="o", capsize=2, label="tide")
    top.set_ylabel("throughput (tokens/s)")
    bottom.errorbar(taus, [100 * r["miss_rate"] for r in runs],
                    yerr=_errors([100 * half_width(r, "miss_rate", errors) for r in runs]), marker="o", capsize=2,
                    color="tab:red", label="tide")
    bottom.set_ylabel("miss rate (%)")
    bottom.set_xlabel("refresh interval tau (denoising steps)")
    if tau_star is not None:
        for ax in (top, bottom):
            ax.axvline(tau_star, linestyle="--", color="gray", label=f"tau* = {tau_star:g}")
    if powers_of_two(taus):
        log2_axis(bottom, taus)
    for ax in (top, bottom):
        legend_outside(ax)
    label, others = group[-2], ", ".join(f"{k}={v}" for k, v in group[-1])
    fig.suptitle(_wrapped(f"TIDE tau sweep{timing_note(runs)}. {caption(errors, runs)}") + "\n"
                 + _wrapped(f"{title}, {label}" + (f", {others}" if others else "")), fontsize=8)
    return _save(fig, out / f"tau_sweep_{_slug(group[:-1])}.png")


def miss_by_step_in_block(series: list[dict[str, Any]]) -> dict[int, float]:
    """Mean miss rate of denoising steps, by step index within their block."""
    sums: dict[int, list[float]] = defaultdict(list)
    for point in series:
        if point.get("kind", "denoise") == "denoise" and isinstance(point.get("miss_rate"), int | float):
            sums[int(point["step"])].append(float(point["miss_rate"]))
    return {step: sum(v) / len(v) for step, v in sorted(sums.items())}


def miss_per_step(runs: Keyed | list[Record], out: Path) -> list[Path]:
    """One figure per row key: a line per system column that recorded a step series."""
    keyed = as_keyed(runs)
    if keyed.frame.empty:
        return []
    written = []
    for group, part in keyed.frame.groupby(keyed.keys, sort=True):
        curves = {r["system"]: miss_by_step_in_block(r["step_series"]) for _, r in part.iterrows()
                  if isinstance(r["step_series"], list)}
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
        legend_outside(ax)
        ax.set_title(f"Miss rate per step{timing_note(part.to_dict('records'))}\n"
                     + key_label(keyed.keys, group), fontsize=9)
        written.append(_save(fig, out / f"miss_per_step_{_slug(group)}.png"))
    return written


def all_figures(runs: Keyed | list[Record], out: Path, errors: str = "ci") -> list[Path]:
    """Every figure the report draws for these runs (their PNGs; the PDF and SVG lie beside),
    each keyed as the report's table; error bars as `errors` says (uncertainty.py)."""
    keyed = as_keyed(runs)
    figures = [throughput_by_budget(keyed, out / "throughput.png", errors), *tau_sweeps(keyed, out, errors),
               *miss_per_step(keyed, out)]
    return [f for f in figures if f is not None]
