"""The one exception type the harness raises for bad input.

`python -m harness` turns a `HarnessError` into a single line on stderr and exit code 2,
so every message must name the problem and the fix on its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn


class HarnessError(Exception):
    """Bad input or a broken artifact (config, checkpoint, prompts file, trace)."""


def exit_with(main: Callable[[list[str]], int], argv: list[str]) -> NoReturn:
    """Run a command-line `main(argv)` and exit with its code; a `HarnessError` becomes one
    line on stderr and exit code 2."""
    try:
        code = main(argv)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
