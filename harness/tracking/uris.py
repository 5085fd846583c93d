"""The form of an MLflow tracking URI, checked before a run (or a push, or a report) starts.

MLflow itself only reports a bad URI when the first call reaches the store, which for a
run is after the work is done. The schemes accepted are those MLflow 3 registers
(mlflow/tracking/_tracking_service/utils.py) minus the file store, which current MLflow
refuses for tracking: sqlite, postgresql, mysql, mssql (each with an optional
`+driver`), http, https, databricks and databricks-uc.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from urllib.parse import urlparse

from harness.common.errors import HarnessError
from harness.common.paths import file_kind

DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
SERVER_SCHEMES = ("http", "https")
OTHER_SCHEMES = ("databricks", "databricks-uc")
EXAMPLES = "sqlite:///outputs/mlflow.db, http://host:5000 or postgresql://user@host/db"


def check_tracking_uri(uri: str, key: str) -> None:
    """A one-line HarnessError naming `key` unless `uri` has a form MLflow can open."""
    text = uri.strip()
    if not text:
        raise HarnessError(f"{key} is empty; use e.g. {EXAMPLES}")
    if any(ch.isspace() for ch in text) or text != uri:
        raise HarnessError(f"{key}={uri!r} contains whitespace; use e.g. {EXAMPLES}")
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    base = scheme.split("+", 1)[0]
    if scheme == "sqlite":
        _check_sqlite(text, key)
    elif scheme in SERVER_SCHEMES:
        _check_server(text, key)
    elif base in DATABASE_SCHEMES and re.fullmatch(r"[a-z]+(\+[a-z0-9_]+)?", scheme):
        if not urlparse(text).hostname and not urlparse(text).path.strip("/"):
            raise HarnessError(f"{key}={uri!r} names no database; use e.g. {base}://user@host/mlflow")
    elif scheme in OTHER_SCHEMES or text in OTHER_SCHEMES:
        return
    elif scheme == "file" or not scheme:
        raise HarnessError(f"{key}={uri!r} is a file store, which current MLflow refuses for tracking; "
                           f"use a SQLite file instead, e.g. sqlite:///outputs/mlflow.db")
    else:
        allowed = ", ".join(("sqlite", *DATABASE_SCHEMES, *SERVER_SCHEMES, *OTHER_SCHEMES))
        raise HarnessError(f"{key}={uri!r} has scheme {scheme!r}, which MLflow cannot track to; "
                           f"use one of {allowed} (e.g. {EXAMPLES})")


def _check_sqlite(uri: str, key: str) -> None:
    if not uri.startswith("sqlite:///") or len(uri) == len("sqlite:///"):
        raise HarnessError(f"{key}={uri!r} is not a SQLite file URI; use sqlite:///<path>.db "
                           "(three slashes and a relative path, four for an absolute one)")
    path = Path(uri[len("sqlite:///"):])
    if path.is_dir():
        raise HarnessError(f"{key}={uri!r} names a directory; give the database file, e.g. {path / 'mlflow.db'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise HarnessError(f"{key}={uri!r}: {parent} is a file, so the database cannot be created there")
            break


def _check_server(uri: str, key: str) -> None:
    parsed = urlparse(uri)
    try:
        port = parsed.port
    except ValueError:
        raise HarnessError(f"{key}={uri!r} has an invalid port; use e.g. http://host:5000") from None
    if not parsed.hostname:
        raise HarnessError(f"{key}={uri!r} names no host; use e.g. http://host:5000")
    if port == 0:
        raise HarnessError(f"{key}={uri!r} has port 0; use the server's port, e.g. http://host:5000")


SQLITE_MAGIC = b"SQLite format 3\x00"
MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}


def check_store_is_mlflow(uri: str, key: str = "tracking.uri") -> None:
    """A SQLite file given as the store is empty, new, or MLflow's own: MLflow would add its
    tables to any other database (or fail on a file that is not one) on its first call.
    Read only; other schemes are not looked at."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri[len("sqlite:///"):])
    kind = file_kind(path)
    if kind == "missing":
        return
    if kind != "file":
        raise HarnessError(f"{key}={uri!r}: {path} is {kind}, not a database file; give a SQLite file")
    if path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        if f.read(16) != SQLITE_MAGIC:
            raise HarnessError(f"{key}={uri!r}: {path} is not a SQLite database; give a new file or an MLflow store")
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
    except sqlite3.Error as exc:
        raise HarnessError(f"{key}={uri!r}: cannot read {path} as SQLite ({exc}); give another file") from None
    if tables and not tables >= MLFLOW_TABLES:
        shown = ", ".join(sorted(tables)[:5])
        raise HarnessError(f"{key}={uri!r}: {path} is a SQLite database but not an MLflow store (tables: {shown}); "
                           "MLflow would add its tables to it: give another file")
