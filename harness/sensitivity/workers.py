"""A sweep's cells analysed side by side, whole cells to each of a few worker processes
(harness/common/workers.py).

Cells share nothing (each has its own traces, replayers and memo) and a replay runs on one
core (its sums stay under torch's parallel grain), so on a machine with several cores the
cells are handed to `jobs` worker processes, the largest (by trace size) first. A worker
computes exactly what the serial loop computes: the tables and CSV are the same to the byte
(tests/unit/test_sensitivity.py). Each worker holds one cell's traces and outcomes at a
time, so peak memory grows with `jobs`; `jobs=1` analyses in this process, cell after cell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from harness.common.workers import in_workers, worker_count
from harness.placement.trace import RoutingTrace
from harness.sensitivity.analysis import Roles
from harness.sensitivity.cells import CellResult, analyse_cell
from harness.sensitivity.sweep import Cell, replayer_for


@dataclass(frozen=True)
class CellSettings:
    """What every cell is analysed with (the command's options)."""

    factors: tuple[float, ...]
    roles: Roles
    constants: tuple[str, ...] | None
    margin_move: float
    tolerance: float
    shortcut: bool
    skip: frozenset[str]


def analyse_one(cell: Cell, settings: CellSettings) -> CellResult:
    """One cell: its replayers (sharing the cell's traces), then the analysis."""
    traces: dict[str, RoutingTrace] = {}
    loads: dict[str, np.ndarray] = {}
    replayers = {label: replayer_for(job, traces, loads) for label, job in cell.jobs.items()
                 if label not in settings.skip}
    for replayer in replayers.values():
        replayer.shortcut = settings.shortcut
    recorded = {label: float(job.result.flat_metrics()["tokens_per_s"]) for label, job in cell.jobs.items()}
    result = analyse_cell(cell.name, replayers, recorded, settings.factors, settings.roles, settings.constants,
                          settings.margin_move, settings.tolerance)
    result.skipped = {label: v for label, v in recorded.items() if label not in replayers}
    return result


def cell_size(cell: Cell) -> int:
    """Bytes of the cell's distinct traces: how long its replays take, roughly."""
    paths = {job.result.identity.trace for job in cell.jobs.values() if job.result.identity.trace}
    return sum(Path(p).stat().st_size for p in paths if Path(p).is_file())


def analyse_cells(cells: Sequence[Cell], settings: CellSettings, jobs: int,
                  done: Callable[[CellResult], None] = lambda result: None) -> list[CellResult]:
    """Every cell's result, in the cells' order; `done` is told of each as it finishes."""
    largest_first = sorted(range(len(cells)), key=lambda i: -cell_size(cells[i]))
    return in_workers(cells, partial(analyse_one, settings=settings), worker_count(jobs, len(cells)),
                      name="sensitivity", unit="cell", order=largest_first, done=done, label=lambda cell: cell.name)
