"""The one exception type the harness raises for bad input.

`python -m harness` turns a `HarnessError` into a single line on stderr and exit code 2,
so every message must name the problem and the fix on its own.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from harness.common.interrupts import end_startup


class HarnessError(Exception):
    """Bad input or a broken artifact (config, checkpoint, prompts file, trace)."""


class OutputError(HarnessError, OSError):
    """A write the harness could not do: a full disk, a read-only file system (harness/common/paths.py).
    Still an OSError, for callers that tolerate one."""


# errnos that only a write produces: any OSError with one is an output problem, not a bug
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def exit_with(main: Callable[[list[str]], int], argv: list[str]) -> NoReturn:
    """Run a command-line `main(argv)` and exit with its code; a `HarnessError` (or a write
    that failed on a full or read-only disk) becomes one line on stderr and exit code 2,
    Ctrl-C one line and exit code 130 (during the imports before it: harness/common/interrupts.py)."""
    end_startup()
    try:
        code = main(argv)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        print(f"error: cannot write {exc.filename or 'the output'} ({exc.strerror}); free space or give a "
              "writable location, then run again", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("interrupted: files are written whole or not at all, so what exists is complete; run it again",
              file=sys.stderr)
        code = 130
    sys.exit(code)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are a HarnessError (one line, exit 2 through
    `exit_with`) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:  # a value off the list: the closest one, as for a key
            choices = re.findall(r"'([^']*)'", found.group(2)) or found.group(2).split(", ")
            close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.5) or \
                [c for c in choices if c.lower() == found.group(1).lower()]
            message += f"; did you mean {close[0]}?" if close else ""
        raise HarnessError(f"{self.prog}: {message}; see {self.prog} --help")


def check_output_dir(path: str | Path, key: str) -> Path:
    """A directory that can be created or already is one (not a file, not under a file)."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "is a file" if candidate == path else f"is under {candidate}, which is a file"
                raise HarnessError(f"{key}={path} {where}; give a directory for the output files")
            break
    return path
