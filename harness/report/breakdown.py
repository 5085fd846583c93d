"""The report's cost breakdown: where each run's modeled time goes (harness/accounting/breakdown.py),
as a table of shares per (cell, system) and, per budget, a figure with one row per system
and one column per generation length (gen 256 beside gen 1024 in the paper's grid): the
mean modeled seconds per denoising forward by window length (prompt + generated so far),
stacked by component."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.accounting.breakdown import COMPONENTS, by_window, shares
from harness.report.plots import _budget_order, _save, _slug, pyplot
from harness.results.records import system_order

Record = dict[str, Any]
LABELS = {"attention_s": "attention", "non_expert_other_s": "other non-expert", "gpu_experts_s": "GPU experts",
          "copies_exposed_s": "exposed copies", "cpu_exposed_s": "exposed CPU experts"}
COLORS = {"attention_s": "tab:blue", "non_expert_other_s": "tab:cyan", "gpu_experts_s": "tab:green",
          "copies_exposed_s": "tab:red", "cpu_exposed_s": "tab:orange"}


def _latest(records: list[Record]) -> dict[tuple[Any, ...], Record]:
    """The latest run with a breakdown per (model, cache, budget, gen, block, system)."""
    out: dict[tuple[Any, ...], Record] = {}
    for r in sorted((r for r in records if r.get("cost_breakdown")), key=lambda r: r.get("order", 0)):
        out[(r.get("model"), r.get("decode_cache"), r.get("budget"), r.get("gen_length"), r.get("block_length"),
             r.get("system"))] = r
    return out


def breakdown_markdown(records: list[Record]) -> str:
    """Each component's share of the modeled time, per run (cell x system)."""
    runs = _latest(records)
    if not runs:
        return ""
    head = " | ".join(LABELS[c] for c in COMPONENTS)
    lines = [f"| cell | system | {head} | s per forward, first / last window |",
             "|---|---|" + "---|" * (len(COMPONENTS) + 1)]
    rank = {s: i for i, s in enumerate(system_order(sorted({str(k[5]) for k in runs})))}
    for key in sorted(runs, key=lambda k: (str(k[0]), str(k[1]), _budget_order(k[2]), k[3] or 0, rank[str(k[5])])):
        r = runs[key]
        share = shares(r["cost_breakdown"])
        bins = by_window(r["cost_breakdown"])
        ends = (f"{sum(bins[0][c] for c in COMPONENTS):.3g} / {sum(bins[-1][c] for c in COMPONENTS):.3g}"
                if bins else "-")
        lines.append(f"| {key[3]}-{key[2]} | {key[5]} | " + " | ".join(f"{100 * share[c]:.1f}%" for c in COMPONENTS)
                     + f" | {ends} |")
    return ("\n## Where the modeled time goes (share of modeled time per component)\n\n"
            + "\n".join(lines) + "\n")


def breakdown_by_window(records: list[Record], out: Path) -> list[Path]:
    """One figure per (model, cache, budget, block): systems x generation lengths."""
    groups: dict[tuple[Any, ...], dict[tuple[Any, Any], Record]] = defaultdict(dict)
    for key, r in _latest(records).items():
        model, cache, budget, gen, block, system = key
        groups[(model, cache, budget, block)][(system, gen)] = r
    paths = []
    for (model, cache, budget, block), runs in sorted(groups.items(), key=lambda kv: _budget_order(kv[0][2])):
        systems = system_order(sorted({s for s, _ in runs}))
        gens = sorted({g for _, g in runs})
        paths.append(_figure(runs, systems, gens, f"{model} cache={cache} budget={budget} block={block}",
                             out / f"breakdown_{_slug((model, cache, budget, block))}.png"))
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
