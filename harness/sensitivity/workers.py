"""A sweep's cells analysed side by side, whole cells to each of a few worker processes.

Cells share nothing (each has its own traces, replayers and memo) and a replay runs on one
core (its sums stay under torch's parallel grain), so on a machine with several cores the
cells are handed to `jobs` worker processes, the largest (by trace size) first. A worker
computes exactly what the serial loop computes: the tables and CSV are the same to the byte
(tests/unit/test_sensitivity.py). Each worker holds one cell's traces and outcomes at a
time, so peak memory grows with `jobs`; `jobs=1` analyses in this process, cell after cell.

Workers are spawned (not forked: torch's thread pools do not survive a fork) and ignore
Ctrl-C; the parent takes it, ends them and exits 130 as every command does. A worker whose
parent is gone (SIGTERM, killed) ends itself within a second. A worker that dies (out of
memory, killed) ends the analysis with one line that names it.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.common.errors import HarnessError
from harness.placement.trace import RoutingTrace
from harness.sensitivity.analysis import Roles
from harness.sensitivity.cells import CellResult, analyse_cell
from harness.sensitivity.sweep import Cell, replayer_for

POLL_S = 0.5  # how often the parent looks for a dead worker while it waits


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


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_count(jobs: int, n_cells: int) -> int:
    """`jobs` (0: one per usable core), never more than there are cells."""
    return max(1, min(jobs or usable_cores(), n_cells))


def cell_size(cell: Cell) -> int:
    """Bytes of the cell's distinct traces: how long its replays take, roughly."""
    paths = {job.result.identity.trace for job in cell.jobs.values() if job.result.identity.trace}
    return sum(Path(p).stat().st_size for p in paths if Path(p).is_file())


def analyse_cells(cells: Sequence[Cell], settings: CellSettings, jobs: int,
                  done: Callable[[CellResult], None] = lambda result: None) -> list[CellResult]:
    """Every cell's result, in the cells' order; `done` is told of each as it finishes."""
    workers = worker_count(jobs, len(cells))
    if workers == 1:
        results = []
        for cell in cells:
            results.append(analyse_one(cell, settings))
            done(results[-1])
        return results
    return _in_workers(cells, settings, workers, done)


def _in_workers(cells: Sequence[Cell], settings: CellSettings, workers: int,
                done: Callable[[CellResult], None]) -> list[CellResult]:
    context = multiprocessing.get_context("spawn")
    tasks: Any = context.Queue()
    # cells no worker took (Ctrl-C, an error) must not hold up the exit: without this, the
    # queue's feeder thread waits at exit for a reader of a full pipe that never comes
    tasks.cancel_join_thread()
    answers: Any = context.Queue()
    for index in sorted(range(len(cells)), key=lambda i: -cell_size(cells[i])):  # largest first
        tasks.put((index, cells[index]))
    for _ in range(workers):
        tasks.put(None)
    threads = max(1, usable_cores() // workers)
    print(f"{len(cells)} cells in {workers} worker processes (jobs=1: one at a time, in this process)",
          file=sys.stderr)
    processes = [context.Process(target=_work, args=(tasks, answers, settings, threads), daemon=True,
                                 name=f"sensitivity-{n}") for n in range(workers)]
    results: list[CellResult | None] = [None] * len(cells)
    terminated = _on_sigterm_exit()
    try:
        for process in processes:  # inside: a Ctrl-C while the second one starts ends the first
            process.start()
        for _ in cells:
            index, result, error = _next_answer(answers, processes)
            if error is not None:
                raise error
            results[index] = result
            done(result)
    finally:
        if terminated is not None:
            signal.signal(signal.SIGTERM, terminated)
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            if process.pid is not None:  # started (or its start cut short after the spawn)
                process.join()
    return [r for r in results if r is not None]


def _on_sigterm_exit() -> Any:
    """SIGTERM (`timeout`, `kill`) becomes SystemExit(143) here, so that the workers are ended
    on the way out; the previous handler is returned (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def exit_143(signum: int, frame: Any) -> None:
        print("terminated: the workers are ended, nothing was written", file=sys.stderr)
        raise SystemExit(143)

    return signal.signal(signal.SIGTERM, exit_143)


def _next_answer(answers: Any, processes: list[Any]) -> tuple[int, CellResult | None, Exception | None]:
    while True:
        try:
            return answers.get(timeout=POLL_S)
        except queue.Empty:
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise HarnessError(f"a sensitivity worker died (exit code {dead[0].exitcode}: out of memory?); "
                                   "run with jobs=1 (one cell at a time, in one process)") from None


def _work(tasks: Any, answers: Any, settings: CellSettings, threads: int) -> None:
    """A worker: cells from `tasks` until None, each answered as (index, result, error)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent takes Ctrl-C and ends the workers
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    torch.set_num_threads(threads)
    while (task := tasks.get()) is not None:
        index, cell = task
        try:
            answers.put((index, analyse_one(cell, settings), None))
        except HarnessError as exc:
            answers.put((index, None, HarnessError(str(exc))))
        except Exception:  # the parent raises it with the worker's traceback
            answers.put((index, None, RuntimeError(f"cell {cell.name}:\n{traceback.format_exc()}")))


def _exit_with(parent: int) -> None:
    """End this worker once its parent is gone (killed, SIGTERM): a cell takes minutes, and
    nobody would read its answer."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)
