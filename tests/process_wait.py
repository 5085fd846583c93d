"""Waiting on subprocesses by their events, never by a wall-clock deadline.

A test that gives a command 300 s fails on a machine shared with other work, where the same
command may take 900 s. Here a command may take as long as it needs; what fails a test is a
hang: the process and its descendants using no CPU at all for `idle_s` seconds (a deadlock,
a blocked read, a lost child). A slow machine only makes the wait longer. Waits for a file or
a line (`wait_until`) end when the event happens, fail at once when the process exits first,
and use the same hang rule.

Children start with SIGINT at its default: a test runner started in the background by a
shell inherits SIGINT ignored, and a child that ignores Ctrl-C cannot be tested for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

IDLE_S = 180.0  # seconds without any CPU used by the process tree: a hang
POLL_S = 0.05
_TICKS = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            kids += [int(k) for k in task.read_text().split()]
    return kids


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process, its waited-for children, and its live descendants."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(f) for f in fields[11:15]) / _TICKS  # utime stime cutime cstime
        todo += _children(current)
    return total


class HangWatch:
    """Raises AssertionError when the process tree has used no CPU for `idle_s` seconds."""

    def __init__(self, proc: subprocess.Popen, what: str, idle_s: float = IDLE_S) -> None:
        self.proc, self.what, self.idle_s = proc, what, idle_s
        self.cpu = tree_cpu_s(proc.pid)
        self.progress_at = time.monotonic()

    def check(self) -> None:
        cpu = tree_cpu_s(self.proc.pid)
        if cpu > self.cpu:
            self.cpu, self.progress_at = cpu, time.monotonic()
        elif time.monotonic() - self.progress_at > self.idle_s:
            kill_tree(self.proc)
            raise AssertionError(f"{self.what}: hung (no CPU used for {self.idle_s:.0f} s; {cpu:.1f} CPU s in all)")


def kill_tree(proc: subprocess.Popen) -> None:
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _descendants(pid: int) -> list[int]:
    found, todo = [], _children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += _children(child)
    return found


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(argv: list[str], **kwargs) -> subprocess.Popen:
    """Popen with SIGINT at its default in the child (module docstring)."""
    return subprocess.Popen(argv, preexec_fn=_default_sigint, **kwargs)


def finish(proc: subprocess.Popen, what: str, idle_s: float = IDLE_S, stdin: str | None = None
           ) -> tuple[str, str]:
    """Wait for the process to end, reading its output (hang rule only); (stdout, stderr)."""
    watch = HangWatch(proc, what, idle_s)
    data = stdin
    while True:
        try:
            out, err = proc.communicate(input=data, timeout=1.0)
            return out or "", err or ""
        except subprocess.TimeoutExpired:
            data = None  # communicate keeps what it already wrote
            watch.check()


def run(argv: list[str], what: str | None = None, idle_s: float = IDLE_S, stdin: str | None = None,
        **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, text=True, ...)` without a deadline."""
    proc = start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 stdin=subprocess.PIPE if stdin is not None else None, **kwargs)
    try:
        out, err = finish(proc, what or " ".join(argv[1:4]), idle_s, stdin)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def wait_until(event: Callable[[], bool], proc: subprocess.Popen, what: str, idle_s: float = IDLE_S) -> None:
    """Poll until `event()` is true; fail if the process exits first or hangs."""
    watch = HangWatch(proc, what, idle_s)
    while not event():
        if proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited ({proc.returncode}) before the event")
        watch.check()
        time.sleep(POLL_S)
