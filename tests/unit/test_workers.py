"""harness/common/workers.py: pieces of work in spawned worker processes come back in their
order, each what the serial loop computes; a piece's one-line error is the command's, any
other names the piece; a dead worker, SIGTERM and the worker count follow their rules."""

from __future__ import annotations

import os
import queue
import signal
import time
from functools import partial

import pytest

from harness.common.errors import HarnessError
from harness.common.workers import _next_answer, _on_sigterm_exit, in_workers, usable_cores, worker_count


def scaled_square(x: int, by: int = 1) -> int:
    """Top level, so that a spawned worker can unpickle it."""
    if x < 0:
        raise HarnessError(f"piece {x} is negative; give pieces >= 0")
    if x == 13:
        raise ValueError("thirteen")
    return by * x * x


def test_pieces_come_back_in_their_order_from_two_workers_whatever_the_order_handed_out() -> None:
    seen: list[int] = []
    got = in_workers([1, 2, 3, 4], partial(scaled_square, by=2), 2, name="test", unit="piece",
                     order=[3, 2, 1, 0], done=seen.append)
    assert got == [2, 8, 18, 32] and sorted(seen) == got
    seen.clear()
    assert in_workers([1, 2, 3], scaled_square, 1, name="test", unit="piece", done=seen.append) == [1, 4, 9]
    assert seen == [1, 4, 9]  # one worker: in this process, in order
    with pytest.raises(HarnessError, match="piece -1 is negative"):
        in_workers([2, -1], scaled_square, 2, name="test", unit="piece")
    with pytest.raises(RuntimeError, match=r"(?s)piece #13:.*ValueError: thirteen"):
        in_workers([2, 13], scaled_square, 2, name="test", unit="piece", label=lambda x: f"#{x}")


def test_a_worker_that_dies_ends_the_work_in_one_line() -> None:
    """A worker killed (out of memory) never answers: the parent notices and names the fix."""

    class Killed:
        exitcode = -9

    with pytest.raises(HarnessError, match=r"a sensitivity worker died \(exit code -9.*jobs=1 \(one cell at a time"):
        _next_answer(queue.Queue(), [Killed()], "sensitivity", "cell")


def test_workers_are_one_per_core_and_never_more_than_the_pieces() -> None:
    assert worker_count(0, 100) == usable_cores()
    assert worker_count(0, 1) == 1 and worker_count(8, 3) == 3 and worker_count(1, 4) == 1


def test_sigterm_while_workers_run_exits_143_through_the_cleanup() -> None:
    """SIGTERM becomes SystemExit(143) while the parent waits for its workers, so that the
    `finally` that ends them runs (the integration test drives Ctrl-C through the same way out)."""
    previous = _on_sigterm_exit()
    assert previous is not None  # pytest runs tests on the main thread
    try:
        with pytest.raises(SystemExit) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)  # the handler runs between two bytecodes of this thread
        assert info.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, previous)
