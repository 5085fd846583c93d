"""Ctrl-C that library code cannot swallow.

Python delivers SIGINT as a KeyboardInterrupt raised wherever the main thread happens to be.
If that is inside a `try` whose `finally` then fails (OmegaConf restoring a node's flags
half-way, for one), the finally's exception replaces the KeyboardInterrupt, an
`except Exception` further up takes it for an ordinary failure (an MLflow logging warning),
and a sweep goes on to exit 0 as if nobody had pressed Ctrl-C. So the handler also records
that SIGINT arrived, and the entry point asks at each job boundary.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

_received = threading.Event()


def on_sigint(signum: int, frame: Any) -> None:
    _received.set()
    raise KeyboardInterrupt


def install_sigint_handler() -> None:
    """Record Ctrl-C as well as raising it; only where Python's own handler is in place
    (a SIGINT that the shell ignores, e.g. a background job, stays ignored)."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)


def interrupted() -> bool:
    return _received.is_set()


def raise_if_interrupted() -> None:
    """Raise the KeyboardInterrupt that something between here and the signal swallowed."""
    if _received.is_set():
        raise KeyboardInterrupt
