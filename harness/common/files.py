"""Atomic result files: written to a temporary sibling, fsynced, then renamed, so a
reader (or a crash) never sees half a file and an older complete file is never lost."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from harness.common.paths import output_error


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write `path` through `write(f)` on a temporary sibling, fsync it and rename it into
    place; on any failure the temporary file goes and the old `path` stays untouched. A
    failure of the place (full, read-only) is an OutputError, one line naming `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise output_error(path, exc) from None
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are shared (SLURM file systems)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a file system remounted read-only: one line (harness/common/paths.py)
        Path(tmp).unlink(missing_ok=True)
        raise output_error(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    text = json.dumps(obj, indent=2, sort_keys=False, default=_jsonable)
    return write_atomic(path, lambda f: f.write(text.encode()))


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def fingerprint(obj: Any, length: int = 16) -> str:
    """Stable short hash of a JSON-able object (cache keys, config hashes)."""

    text = json.dumps(obj, sort_keys=True, default=_jsonable)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def publish_dir(tmp: Path, directory: Path, is_complete: Callable[[Path], bool]) -> Path:
    """Rename the finished build `tmp` into `directory`. A parallel job (a joblib sweep) that
    finished first wins: its complete directory stays and `tmp` goes. An incomplete
    `directory` (an interrupted build) is replaced."""
    if is_complete(directory):
        shutil.rmtree(tmp, ignore_errors=True)
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    try:
        os.replace(tmp, directory)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_complete(directory):
            raise
    return directory
