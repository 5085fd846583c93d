"""What `python -m harness.sensitivity` writes: a markdown table, a CSV of every replay on
the grid, a tornado plot per cell, and the same under the sweep's MLflow parent run."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from pathlib import Path

from harness.common.files import write_atomic
from harness.sensitivity.analysis import ConstantResult, Crossing, Roles, ranking, tornado
from harness.sensitivity.cells import CellResult, base_mismatches
from harness.sensitivity.scaling import label_of

CSV_COLUMNS = ["cell", "constant", "factor", "system", "tokens_per_s", "rank", "winner", "margin"]


def _factor(crossing: Crossing, roles: Roles, what: str) -> str:
    if crossing.factor is None:
        return "-"
    detail = roles.winner(crossing.speeds) if what == "winner" else f"margin {roles.margin(crossing.speeds):.2f}x"
    return f"{crossing.factor:.3g}x ({detail})"


def _smallest(result: ConstantResult, which: str) -> float | None:
    return result.smallest(which)


def cell_markdown(cell: CellResult, roles: Roles) -> str:
    base_winner, base_margin = roles.winner(cell.base), roles.margin(cell.base)
    speeds = ", ".join(f"{s} {cell.base[s]:.2f}" for s in ranking(cell.base))
    lines = [f"### {cell.name} (hardware={cell.hardware})", "",
             f"Modeled tokens/s at 1x: {speeds}. Winner **{base_winner}**, margin over the best baseline "
             f"**{base_margin:.2f}x**. {cell.replays} replays, {cell.recharges} re-charges, {cell.seconds:.1f} s.", ""]
    if cell.skipped:
        lines += ["Not replayed (skip=): " + ", ".join(f"{s} {v:.2f} at 1x" for s, v in cell.skipped.items()) + ".",
                  ""]
    wrong = base_mismatches(cell)
    if wrong:
        lines += [f"**Warning**: the 1x replay differs from the sweep's result for {', '.join(wrong)}.", ""]
    lines += ["| constant | source | margin at lowest / highest factor | winner flips at (down; up) | "
              "margin moves > 10% at (down; up) |", "|---|---|---|---|---|"]
    rows = {r.constant: r for r in cell.constants}
    for constant, low, high in tornado(cell.constants, roles):
        r = rows[constant]
        source = "estimate" if constant in cell.estimates else "sourced"
        lines.append(f"| {label_of(constant)} (`{constant}`) | {source} | {low:.2f}x / {high:.2f}x | "
                     f"{_factor(r.winner_down, roles, 'winner')}; {_factor(r.winner_up, roles, 'winner')} | "
                     f"{_factor(r.margin_down, roles, 'margin')}; {_factor(r.margin_up, roles, 'margin')} |")
    return "\n".join(lines) + "\n"


def headline(cells: Sequence[CellResult], roles: Roles) -> str:
    """Per constant, over all cells: the smallest change that flips a winner or moves a
    margin by more than 10% (the factor nearest 1x, and in which cell)."""
    constants = list(dict.fromkeys(r.constant for c in cells for r in c.constants))
    lines = ["| constant | source | smallest winner flip (cell) | smallest 10% margin move (cell) |",
             "|---|---|---|---|"]
    for constant in constants:
        found = {}
        for which in ("winner", "margin"):
            best = None
            for cell in cells:
                for r in cell.constants:
                    f = _smallest(r, which) if r.constant == constant else None
                    if f is not None and (best is None or abs(math.log(f)) < abs(math.log(best[0]))):
                        best = (f, cell.name)
            found[which] = f"{best[0]:.3g}x ({best[1]})" if best else "none in range"
        source = "estimate" if any(constant in c.estimates for c in cells) else "sourced"
        lines.append(f"| {label_of(constant)} (`{constant}`) | {source} | {found['winner']} | {found['margin']} |")
    return "\n".join(lines) + "\n"


def report_markdown(cells: Sequence[CellResult], roles: Roles, command: str, factors: Sequence[float]) -> str:
    grid = ", ".join(f"{f:.3g}" for f in factors)
    estimates = sorted({c for cell in cells for c in cell.estimates})
    head = ["# Sensitivity of the modeled ranking to the hardware constants (modeled throughput)", "",
            f"Command: `{command}`", "",
            f"Each constant scaled by {grid} (one at a time), every system replayed over its cell's trace. "
            f"Winner: the fastest of {', '.join('non-' + r for r in roles.references)} systems; margin: the "
            f"fastest non-baseline over the best baseline ({', '.join(roles.baselines)}). A factor multiplies the "
            "constant (4x bandwidth = faster, 4x overhead = slower). Estimated constants: "
            f"{', '.join(estimates) or 'none'}.", "", "## Headline", "", headline(cells, roles), "## Per cell", ""]
    return "\n".join(head) + "\n".join(cell_markdown(c, roles) for c in cells)


def csv_text(cells: Sequence[CellResult], roles: Roles) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for cell in cells:
        for r in cell.constants:
            for factor, speeds in sorted(r.grid.items()):
                order = ranking(speeds)
                for system in order:
                    writer.writerow([cell.name, r.constant, f"{factor:.6g}", system, f"{speeds[system]:.6g}",
                                     order.index(system) + 1, roles.winner(speeds), f"{roles.margin(speeds):.6g}"])
    return buffer.getvalue()


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def margin_label(speeds: dict[str, float], roles: Roles) -> str:
    """The tornado's x label: the margin is the fastest non-baseline contender over the
    fastest baseline, so it names both sides (not the 1x winner, which may be a baseline); the
    unit on a line of its own, so the label fits the figure's width."""
    contenders = roles.contenders(speeds)
    ours = [s for s in contenders if s not in roles.baselines]
    theirs = [s for s in contenders if s in roles.baselines]
    return (f"margin: best of {', '.join(ours) or '-'} over best of {', '.join(theirs) or '-'}\n"
            "(tokens/s ratio, modeled)")


def tornado_plot(cell: CellResult, roles: Roles, path: Path) -> Path:
    """Bars from the margin at the lowest factor to the margin at the highest, per constant,
    the widest on top; the 1x margin as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = tornado(cell.constants, roles)[::-1]
    base = roles.margin(cell.base)
    low_f, high_f = min(cell.constants[0].grid), max(cell.constants[0].grid)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.5))
    for i, (_, low, high) in enumerate(rows):
        ax.barh(i, low - base, left=base, color="tab:blue", label=f"x{low_f:.3g}" if i == 0 else None)
        ax.barh(i, high - base, left=base, color="tab:orange", label=f"x{high_f:.3g}" if i == 0 else None)
    ax.axvline(base, color="black", linewidth=1)
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(rows)), [label_of(c) for c, _, _ in rows])
    ax.set_xlabel(margin_label(cell.base, roles))
    ax.set_title(f"{cell.name}: what moves the margin ({base:.2f}x at 1x)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path


def write_outputs(cells: Sequence[CellResult], roles: Roles, out: Path, command: str,
                  factors: Sequence[float]) -> list[Path]:
    text = report_markdown(cells, roles, command, factors)
    files = [write_atomic(out / "sensitivity.md", lambda f: f.write(text.encode())),
             write_atomic(out / "sensitivity.csv", lambda f: f.write(csv_text(cells, roles).encode()))]
    files += [tornado_plot(c, roles, out / f"tornado_{slug(c.name)}.png") for c in cells]
    return files
