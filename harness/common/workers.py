"""Independent pieces of work handed to a few worker processes, one whole piece each
(the sensitivity analysis's cells, the regime map's families).

The pieces share nothing and each runs on one core, so on a machine with several cores they
go to `workers` processes in the order given (the largest first, where sizes differ); the
answers come back in the pieces' order and are what the serial loop computes. Workers are
spawned (not forked: torch's thread pools do not survive a fork) and ignore Ctrl-C; the
parent takes it, ends them and exits 130 as every command does. A worker whose parent is
gone (SIGTERM, killed) ends itself within a second. A worker that dies (out of memory,
killed) ends the work with one line that names it and the fix (jobs=1).
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
from typing import Any

import torch

from harness.common.errors import HarnessError

POLL_S = 0.5  # how often the parent looks for a dead worker while it waits


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_count(jobs: int, n_pieces: int) -> int:
    """`jobs` (0: one per usable core), never more than there are pieces."""
    return max(1, min(jobs or usable_cores(), n_pieces))


def in_workers(pieces: Sequence[Any], work: Callable[[Any], Any], workers: int, *, name: str, unit: str,
               order: Sequence[int] | None = None, done: Callable[[Any], None] = lambda result: None,
               label: Callable[[Any], str] = str, units: str = "") -> list[Any]:
    """work(piece) for every piece, in the pieces' order, computed by `workers` spawned
    processes (`work` must pickle: a module-level function or a partial of one); `done` is
    told of each result as it arrives; `order` is the order the pieces are handed out in.
    `name`, `unit` and `units` word the messages ("sensitivity", "cell", default `unit` + "s");
    `label` names a piece whose work raised. One worker: every piece in this process, in order
    (least memory; errors raised as they are)."""
    if workers == 1:
        results = []
        for piece in pieces:
            results.append(work(piece))
            done(results[-1])
        return results
    context = multiprocessing.get_context("spawn")
    tasks: Any = context.Queue()
    # pieces no worker took (Ctrl-C, an error) must not hold up the exit: without this, the
    # queue's feeder thread waits at exit for a reader of a full pipe that never comes
    tasks.cancel_join_thread()
    answers: Any = context.Queue()
    for index in order if order is not None else range(len(pieces)):
        tasks.put((index, pieces[index]))
    for _ in range(workers):
        tasks.put(None)
    threads = max(1, usable_cores() // workers)
    print(f"{len(pieces)} {units or unit + 's'} in {workers} worker processes (jobs=1: one at a time, in this process)",
          file=sys.stderr)
    processes = [context.Process(target=_work, args=(tasks, answers, work, threads), daemon=True,
                                 name=f"{name}-{n}") for n in range(workers)]
    results: list[Any] = [None] * len(pieces)
    terminated = _on_sigterm_exit()
    try:
        for process in processes:  # inside: a Ctrl-C while the second one starts ends the first
            process.start()
        for _ in pieces:
            index, result, error = _next_answer(answers, processes, name, unit)
            if isinstance(error, HarnessError):
                raise error
            if error is not None:
                raise RuntimeError(f"{unit} {label(pieces[index])}:\n{error}")
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
    return results


def _on_sigterm_exit() -> Any:
    """SIGTERM (`timeout`, `kill`) becomes SystemExit(143) here, so that the workers are ended
    on the way out; the previous handler is returned (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def exit_143(signum: int, frame: Any) -> None:
        print("terminated: the workers are ended, nothing was written", file=sys.stderr)
        raise SystemExit(143)

    return signal.signal(signal.SIGTERM, exit_143)


def _next_answer(answers: Any, processes: list[Any], name: str, unit: str) -> tuple[int, Any, Any]:
    while True:
        try:
            return answers.get(timeout=POLL_S)
        except queue.Empty:
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise HarnessError(f"a {name} worker died (exit code {dead[0].exitcode}: out of memory?); "
                                   f"run with jobs=1 (one {unit} at a time, in one process)") from None


def _work(tasks: Any, answers: Any, work: Callable[[Any], Any], threads: int) -> None:
    """A worker: pieces from `tasks` until None, each answered as (index, result, error), the
    error a HarnessError (its one line) or the traceback of anything else."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent takes Ctrl-C and ends the workers
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    torch.set_num_threads(threads)
    while (task := tasks.get()) is not None:
        index, piece = task
        try:
            answers.put((index, work(piece), None))
        except HarnessError as exc:
            answers.put((index, None, HarnessError(str(exc))))
        except Exception:  # the parent raises it with the worker's traceback
            answers.put((index, None, traceback.format_exc()))


def _exit_with(parent: int) -> None:
    """End this worker once its parent is gone (killed, SIGTERM): a piece takes minutes, and
    nobody would read its answer."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)
