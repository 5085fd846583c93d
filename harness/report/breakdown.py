"""The report's cost breakdown: where each run's modeled time goes (harness/accounting/breakdown.py),
as a table of shares per (row of the report's table, system) and, per row but its generation
length, a figure with one row per system and one column per generation length (gen 256
beside gen 1024 in the paper's grid): the mean modeled seconds per denoising forward by
window length (prompt + generated so far), stacked by component."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.accounting.breakdown import COMPONENTS, by_window, shares
from harness.report.keys import Keyed, as_keyed, cell_headers, cell_values, experts_per_row, key_label, rows_of
from harness.report.markdown import pipe_table
from harness.report.plots import _save, _slug, pyplot
from harness.results.records import system_order

Record = dict[str, Any]
LABELS = {"attention_s": "attention", "non_expert_other_s": "other non-expert", "gpu_experts_s": "GPU experts",
          "copies_exposed_s": "exposed copies", "cpu_exposed_s": "exposed CPU experts"}
COLORS = {"attention_s": "tab:blue", "non_expert_other_s": "tab:cyan", "gpu_experts_s": "tab:green",
          "copies_exposed_s": "tab:red", "cpu_exposed_s": "tab:orange"}


def _with_breakdown(keyed: Keyed) -> list[Record]:
    """The kept runs (one per row and system column) that report a breakdown, in table order."""
    out = []
    for _, part in rows_of(keyed):
        by_system = {str(r["system"]): r for r in part.to_dict("records") if r.get("cost_breakdown")}
        out += [by_system[s] for s in system_order(list(by_system))]
    return out


def breakdown_markdown(runs: Keyed | list[Record]) -> str:
    """Each component's share of the modeled time, per run (row of the table x system)."""
    keyed = as_keyed(runs)
    experts = experts_per_row(keyed)
    lines = []
    for r in _with_breakdown(keyed):
        share = shares(r["cost_breakdown"])
        bins = by_window(r["cost_breakdown"])
        ends = (f"{sum(bins[0][c] for c in COMPONENTS):.3g} / {sum(bins[-1][c] for c in COMPONENTS):.3g}"
                if bins else "-")
        lines.append([*cell_values(keyed, r, experts), r["system"], *(f"{100 * share[c]:.1f}%" for c in COMPONENTS),
                      ends])
    if not lines:
        return ""
    headers = [*cell_headers(keyed, {"gen_length": "gen", "block_length": "block"}), "system",
               *(LABELS[c] for c in COMPONENTS), "s per forward, first / last window"]
    return ("\n## Where the modeled time goes (share of modeled time per component)\n\n"
            + pipe_table(headers, lines))


def breakdown_by_window(runs: Keyed | list[Record], out: Path) -> list[Path]:
    """One figure per row of the table but its generation length (the same settings
    otherwise): systems x generation lengths."""
    keyed = as_keyed(runs)
    figure_keys = [k for k in keyed.keys if k != "gen_length"]
    groups: dict[tuple[Any, ...], dict[tuple[Any, Any], Record]] = defaultdict(dict)
    for r in _with_breakdown(keyed):
        groups[tuple(r[k] for k in figure_keys)][(r["system"], r["gen_length"])] = r
    paths = []
    for values, runs_of in groups.items():
        systems = system_order(sorted({s for s, _ in runs_of}))
        gens = sorted({g for _, g in runs_of}, key=lambda g: (not isinstance(g, int), g if isinstance(g, int) else 0))
        paths.append(_figure(runs_of, systems, gens, key_label(figure_keys, values),
                             out / f"breakdown_{_slug(values)}.png"))
    return paths


def _figure(runs: dict[tuple[Any, Any], Record], systems: list[str], gens: list[Any], title: str,
            path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(len(systems), len(gens), figsize=(4.5 * len(gens), 2.4 * len(systems)),
                             squeeze=False, sharey="row")
    for i, system in enumerate(systems):
        for j, gen in enumerate(gens):
            ax = axes[i][j]
            record = runs.get((system, gen))
            bins = by_window(record["cost_breakdown"]) if record else []
            if not bins:
                ax.set_axis_off()
                continue
            x = [b["window_lo"] for b in bins]
            bottom = [0.0] * len(bins)
            for c in COMPONENTS:
                height = [b[c] for b in bins]
                ax.bar(x, height, width=0.9 * (bins[0]["window_hi"] - bins[0]["window_lo"]), bottom=bottom,
                       align="edge", color=COLORS[c], label=LABELS[c])
                bottom = [a + h for a, h in zip(bottom, height, strict=True)]
            ax.set_title(f"{system}, gen {gen}", fontsize=9)
            if i == len(systems) - 1:
                ax.set_xlabel("window length (tokens)")
            if j == 0:
                ax.set_ylabel("s / forward")
    handles, labels = next(((a.get_legend_handles_labels()) for row in axes for a in row if a.has_data()), ([], []))
    fig.legend(handles, labels, loc="lower center", ncol=len(COMPONENTS), fontsize=8)
    fig.suptitle(f"Modeled seconds per denoising forward by window length: {title} (modeled)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return _save(fig, path)
