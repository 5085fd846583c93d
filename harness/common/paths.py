"""What the harness opens and where it writes (docs/bad-input.md).

Inputs: only regular files are opened. A FIFO blocks `open()` until a writer comes, a
character device such as /dev/zero never ends, so anything that is not a regular file
(after following symbolic links) is refused with one line that says what it is.

Outputs: a directory the harness will write into is created and probed (a file written and
removed) before any work starts, so a run dir under a file, a read-only cache or a path
under /proc fails in the first second, not after minutes of decoding. A write that fails
later (a full disk, a file system remounted read-only) is an `OutputError`: one line naming
the file and saying that its previous version, if any, is intact.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from harness.common.errors import WRITE_ERRNOS, HarnessError, OutputError

# errors of the place written to, not of the harness: the fix is another place or more space
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO,
                 errno.ENOTDIR, errno.EISDIR, errno.ENOENT}


def file_kind(path: Path) -> str:
    """'file', 'missing', or what else the path is, in words ('a FIFO (named pipe)', ...)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a path under a file does not exist
        return "a broken symbolic link" if path.is_symlink() else "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def require_regular_file(path: str | Path, label: str, fix: str) -> Path:
    """`path` if it is a regular file (or a link to one); else a one-line HarnessError
    '<label> does not exist; <fix>' or '<label> is a FIFO (named pipe), not a regular file; <fix>'."""
    path = Path(path)
    kind = file_kind(path)
    if kind == "file":
        return path
    if kind == "missing":
        raise HarnessError(f"{label} does not exist; {fix}")
    if kind == "a directory":
        raise HarnessError(f"{label} is a directory; {fix}")
    raise HarnessError(f"{label} is {kind}, not a regular file; {fix}")


def check_no_special_files(directory: Path, label: str) -> None:
    """Every entry of `directory` that is not a directory is a regular file: a checkpoint's
    files are opened by the loader and by the tokenizer library, neither of which checks."""
    for entry in sorted(directory.iterdir()):
        kind = file_kind(entry)
        if kind not in ("file", "a directory"):
            raise HarnessError(f"{label} holds {entry.name}, which is {kind}, not a regular file; "
                               "replace it with the real file")


def probe_output_dir(path: str | Path, key: str, create: bool = True) -> Path:
    """Create the directory `path` (and its parents) and write and remove a probe file in
    it; any failure is one line naming `key`, the path and the reason. Returns the path.
    With create=False nothing is left behind: the probe goes into the nearest existing
    directory on the way to `path` (a tool that may still refuse its input creates nothing)."""
    path = Path(path)
    existing = path
    for candidate in (path, *path.parents):
        existing = candidate
        kind = file_kind(candidate)
        if kind == "a directory":
            break
        if kind != "missing":
            what = "a file" if kind == "file" else kind
            where = f"is {what}" if candidate == path else f"is under {candidate}, which is {what}"
            raise HarnessError(f"{key}={path} {where}; give a directory for the output files")
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=path if create else existing)
        try:
            os.write(fd, b"\n")  # one byte: a full file system refuses it, an empty file it may allow
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise HarnessError(f"{key}={path} cannot be written ({exc.strerror or exc}); "
                           "give a directory this user can write to, on a file system with free space") from None
    return path


def probe_output_parent(path: str | Path, key: str) -> Path:
    """For a directory the harness (or Hydra) creates later under a timestamped name: its
    parent is created and probed now, and the path itself must not be a file."""
    path = Path(path)
    kind = file_kind(path)
    if kind not in ("missing", "a directory"):
        raise HarnessError(f"{key}={path} is {'a file' if kind == 'file' else kind}; give a directory for the "
                           "output files")
    probe_output_dir(path.parent, key)
    return path


def output_error(path: Path, exc: OSError) -> OSError:
    """The error to raise for a failed write of `path`: an OutputError for a problem of the
    place (full, read-only, not permitted), the original error otherwise (a bug)."""
    if isinstance(exc, OutputError) or exc.errno not in OUTPUT_ERRNOS:
        return exc
    what = exc.strerror or str(exc)
    return OutputError(f"cannot write {path} ({what}); it was not changed (its previous version, if any, is "
                       "intact): free space or make the directory writable, then run again")


def as_output_error(exc: BaseException) -> BaseException:
    """An OSError of a full or read-only place raised by a writer that does not go through
    write_atomic (a plot, a CSV, Hydra's files) as an OutputError; anything else as it is."""
    if isinstance(exc, OSError) and not isinstance(exc, OutputError) and exc.errno in WRITE_ERRNOS:
        return output_error(Path(exc.filename or "a file"), exc)
    return exc
