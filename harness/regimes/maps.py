"""The regime map's verdicts and figures (docs/routing-regimes.md): per family, the winner
among the single-GPU offloading systems at each regime point (oracle, an upper bound, and
gpu_only excluded), each system's margin over the best baseline (fiddler, static_split,
mixtral_offload), the points where the winner flips between neighbours, and where each
paper's claim holds.

  DALI       hit-rate rise: dali's hit rate (1 - miss rate) above mixtral_offload's LRU cache's
  GEM        latency gain over ep_linear >= 7.9% (low GPU variability) / 16.5% (high)
  TIDE       tokens/s above fiddler's with tau* in 3..6
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.regimes.grid import BASELINES, LOCALITY, SHARED, SINGLE, SKEW, Cell
from harness.report.plots import pyplot

CONTENDERS = tuple(s for s in SINGLE if s != "oracle")


def winner(cell: Cell) -> str:
    return max(CONTENDERS, key=lambda s: cell.figures[s]["tokens_per_s"])


def lead(cell: Cell) -> float:
    """The winner's tokens/s over the runner-up's, minus 1: under about 2% a generator seed can
    hand the point to the runner-up (mixtral's dali/static_split points, docs/routing-regimes.md)."""
    first, second = sorted((cell.figures[s]["tokens_per_s"] for s in CONTENDERS), reverse=True)[:2]
    return first / second - 1 if second > 0 else float("inf")


def margin(cell: Cell, system: str) -> float:
    best = max(cell.figures[b]["tokens_per_s"] for b in BASELINES)
    return cell.figures[system]["tokens_per_s"] / best - 1 if best > 0 else 0.0


def claims(cell: Cell) -> dict[str, Any]:
    f = cell.figures
    gem_low = 1 - f["gem/low"]["modeled_time_s"] / f["ep_linear/low"]["modeled_time_s"]
    gem_high = 1 - f["gem/high"]["modeled_time_s"] / f["ep_linear/high"]["modeled_time_s"]
    rise = (1 - f["dali"]["miss_rate"]) - (1 - f["mixtral_offload"]["miss_rate"])
    tau = f["tide"]["tau_star"]
    return {"dali_hit_rise": rise, "dali_holds": rise > 0,
            "gem_gain_low": gem_low, "gem_gain_high": gem_high,
            "gem_holds": gem_low >= 0.079 and gem_high >= 0.165,
            "tide_gain": f["tide"]["tokens_per_s"] / f["fiddler"]["tokens_per_s"] - 1, "tide_tau_star": tau,
            "tide_holds": f["tide"]["tokens_per_s"] > f["fiddler"]["tokens_per_s"] and 3 <= tau <= 6}


def grid_cells(cells: list[Cell]) -> dict[tuple[float, float, float], Cell]:
    return {(c.point["shared"], c.point["skew"], c.point["locality"]): c for c in cells if "anchor" not in c.point}


def flips(cells: list[Cell]) -> list[str]:
    """Neighbouring grid points (one knob one step apart) whose winners differ."""
    grid = grid_cells(cells)
    axes = (SHARED, SKEW, LOCALITY)
    out = []
    for key, cell in grid.items():
        for axis in range(3):
            values = axes[axis]
            i = values.index(key[axis])
            if i + 1 < len(values):
                other = grid[tuple(values[i + 1] if a == axis else key[a] for a in range(3))]
                if winner(cell) != winner(other):
                    out.append(f"{_point(key)} -> {('shared', 'skew', 'locality')[axis]}={values[i + 1]}: "
                               f"{winner(cell)} -> {winner(other)}")
    return out


def _point(key: tuple[float, float, float]) -> str:
    return f"shared={key[0]} skew={key[1]} locality={key[2]}"


def plot_family(family: str, cells: list[Cell], out: Path) -> list[Path]:
    """Heatmaps (locality across, skew down, one panel per shared): the winner, and each
    contender's margin over the best baseline; PNG and SVG."""
    plt = pyplot()
    grid = grid_cells(cells)
    names = list(CONTENDERS)
    rows = 1 + len(names)
    fig, axes = plt.subplots(rows, len(SHARED), figsize=(3.2 * len(SHARED), 2.2 * rows), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for j, sh in enumerate(SHARED):
        win = np.array([[names.index(winner(grid[(sh, sk, lo)])) for lo in LOCALITY] for sk in SKEW])
        ax = axes[0, j]
        ax.imshow(win, cmap=cmap, vmin=0, vmax=9, aspect="auto")
        for a in range(len(SKEW)):
            for b in range(len(LOCALITY)):
                ax.text(b, a, names[win[a, b]], ha="center", va="center", fontsize=6)
        ax.set_title(f"{family}: winner, shared={sh}", fontsize=8)
        for i, name in enumerate(names, start=1):
            m = np.array([[margin(grid[(sh, sk, lo)], name) for lo in LOCALITY] for sk in SKEW])
            ax = axes[i, j]
            im = ax.imshow(m, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
            for a in range(len(SKEW)):
                for b in range(len(LOCALITY)):
                    ax.text(b, a, f"{m[a, b]:+.0%}", ha="center", va="center", fontsize=6)
            ax.set_title(f"{name} vs best baseline, shared={sh}", fontsize=8)
        for ax in axes[:, j]:
            ax.set_xticks(range(len(LOCALITY)), [str(v) for v in LOCALITY], fontsize=6)
            ax.set_yticks(range(len(SKEW)), [str(v) for v in SKEW], fontsize=6)
            ax.set_xlabel("locality", fontsize=6)
            ax.set_ylabel("skew", fontsize=6)
    fig.colorbar(im, ax=axes[1:, :].ravel().tolist(), shrink=0.5, label="tokens/s margin (modeled)")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"regimes_{family}.png", out / f"regimes_{family}.svg"]
    for path in paths:  # no date, the report's SVG id salt: the same map gives the same files
        fig.savefig(path, dpi=110, metadata={"Date": None} if path.suffix == ".svg" else {})
    plt.close(fig)
    return paths
