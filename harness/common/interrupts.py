"""Ctrl-C that library code cannot swallow.

Python delivers SIGINT as a KeyboardInterrupt raised wherever the main thread happens to be.
If that is inside a `try` whose `finally` then fails (OmegaConf restoring a node's flags
half-way, for one), the finally's exception replaces the KeyboardInterrupt, an
`except Exception` further up takes it for an ordinary failure (an MLflow logging warning),
and a sweep goes on to exit 0 as if nobody had pressed Ctrl-C. So the handler also records
that SIGINT arrived, and the entry point asks at each job boundary.

Before that handler is in place, a command spends seconds importing (Hydra, torch, MLflow):
`guard_startup`, installed by `import harness` when the process is a command, makes a Ctrl-C
there one line and exit 130 instead of a traceback from whatever module was loading
(docs/bad-input.md). Nothing is written during imports, so there is nothing to save.

A few writes must not be cut in half: `deferred_interrupts` holds Ctrl-C and SIGTERM back
while an MLflow run is logged (a KeyboardInterrupt inside SQLite's transaction left a
half-logged run and, once on CI, a store still locked 20 s later when the sweep's parent
run was ended) and delivers them when the write is done; a second one of the same kind is
delivered at once, for a user who means it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

_received = threading.Event()


def on_sigint(signum: int, frame: Any) -> None:
    _received.set()
    raise KeyboardInterrupt


STARTUP_LINE = b"interrupted: while starting, before anything was written; run the command again\n"


def on_startup_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C during a command's imports: one line, exit 130, no traceback and no cleanup
    (a half-imported module has nothing to flush)."""
    _received.set()
    os.write(2, STARTUP_LINE)
    os._exit(130)


def is_command(argv: list[str]) -> bool:
    """Whether this process runs one of the harness's commands: `python -m harness...`
    (argv[0] is "-m" while Python imports the package holding the module) or a `harness*`
    console script; not a notebook or a program that imports the API."""
    if not argv:
        return False
    return argv[0] == "-m" or os.path.basename(argv[0]).startswith("harness")


def guard_startup(argv: list[str] | None = None) -> None:
    """Make Ctrl-C one line and exit 130 from here until the command's own handling starts
    (`end_startup`, `install_sigint_handler`); only in a command, and only where Python's
    own handler is in place."""
    if is_command(sys.argv if argv is None else argv) and _default_handler_in_place():
        signal.signal(signal.SIGINT, on_startup_sigint)


def end_startup() -> None:
    """The imports are done: Ctrl-C raises KeyboardInterrupt again, for the command to report."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is on_startup_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _default_handler_in_place() -> bool:
    return threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler


def install_sigint_handler() -> None:
    """Record Ctrl-C as well as raising it; only where Python's own handler (or the startup
    guard) is in place (a SIGINT that the shell ignores, e.g. a background job, stays ignored)."""
    end_startup()
    if _default_handler_in_place():
        signal.signal(signal.SIGINT, on_sigint)


def interrupted() -> bool:
    return _received.is_set()


def raise_if_interrupted() -> None:
    """Raise the KeyboardInterrupt that something between here and the signal swallowed."""
    if _received.is_set():
        raise KeyboardInterrupt


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _deliver(signum: int) -> None:
    """Act on a signal as its handler in place now would have."""
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Run the block whole: Ctrl-C or SIGTERM arriving inside it acts when it ends (as if it
    had arrived then), a second of the same kind at once. Only the main thread gets signals;
    elsewhere, and for a signal that is ignored, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in HELD_SIGNALS}
    previous = {s: h for s, h in previous.items() if h not in (signal.SIG_IGN, None)}
    pending: list[int] = []

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def hold(signum: int, frame: Any) -> None:
        if signum in pending:
            pending.clear()  # delivered here, not again at the end
            restore()
            _deliver(signum)
        else:
            pending.append(signum)

    for signum in previous:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        restore()
        for signum in pending[:1]:  # the first one decides how the process stops
            _deliver(signum)
