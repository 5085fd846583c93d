"""When each request of a replay arrives (docs/traces-and-experiments.md, "Serving"):
`workload.arrivals` names the process, and this module checks its settings and gives the
arrival times, in modeled seconds, one per request in prompt order.

  static    every request at time 0, served in lock-step batches (harness/traces/serving.py)
  poisson   a seeded Poisson process of `workload.arrival_rate` requests per second
            (`workload.arrival_seed`, default 0)
  trace     a recorded arrival trace, `workload.arrival_trace=<file>`: one arrival time in
            seconds per request, in prompt order, non-negative and non-decreasing, as
              .json  a JSON array of numbers:  [0.0, 0.12, 0.12, 0.9]
              .csv   one number per line, or a header line naming a column `arrival_s` and
                     that column read from every row (other columns are ignored)

The settings with their defaults are left out of the config hash (`hashed_workload`), so a
static run keeps the resume identity it had before arrivals existed.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

from harness.common.errors import HarnessError
from harness.common.paths import require_regular_file
from harness.traces.arrivals import check_arrivals, poisson_arrivals

ARRIVAL_DEFAULTS: dict[str, Any] = {"arrivals": "static", "arrival_rate": None, "arrival_seed": 0,
                                    "arrival_trace": None}
MAX_ARRIVAL_FILE_BYTES = 64 * 2**20
CSV_COLUMN = "arrival_s"


def check_arrival_settings(kind: str, rate: float | None, seed: int, path: str | None) -> None:
    """One-line errors for the arrival settings, alone and together: each setting belongs
    to one process, and one given to another would be ignored without a word."""
    check_arrivals(kind, rate)
    if kind == "trace" and path is None:
        raise HarnessError("workload.arrivals=trace needs workload.arrival_trace=<file> (a JSON or CSV list of "
                           "arrival times in seconds, one per request)")
    if rate is not None and kind != "poisson":
        raise HarnessError(f"workload.arrival_rate={rate} is the rate of workload.arrivals=poisson, but "
                           f"workload.arrivals={kind}: add workload.arrivals=poisson or drop the rate")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise HarnessError(f"workload.arrival_seed={seed!r} must be a whole number >= 0")
    if seed != 0 and kind != "poisson":
        raise HarnessError(f"workload.arrival_seed={seed} seeds workload.arrivals=poisson, but "
                           f"workload.arrivals={kind}: add workload.arrivals=poisson or drop the seed")
    if path is not None and kind != "trace":
        raise HarnessError(f"workload.arrival_trace={path!r} is read by workload.arrivals=trace, but "
                           f"workload.arrivals={kind}: add workload.arrivals=trace or drop the file")


def arrival_times(workload: Any, n_requests: int) -> list[float] | None:
    """The arrival times of the `n_requests` requests a replay serves; None for static
    batches. `workload` is the run's workload config (its arrival settings)."""
    kind = workload.arrivals
    if kind == "static":
        return None
    if kind == "poisson":
        return poisson_arrivals(n_requests, workload.arrival_rate, workload.arrival_seed)
    return read_arrival_trace(workload.arrival_trace, n_requests)


def read_arrival_trace(path: str | Path, n_requests: int) -> list[float]:
    """The arrival times a recorded arrival trace lists (module docstring), checked."""
    path = Path(path)
    label = f"workload.arrival_trace={str(path)!r}"
    require_regular_file(path, label, "give a JSON or CSV list of arrival times in seconds, one per request")
    if path.stat().st_size > MAX_ARRIVAL_FILE_BYTES:
        raise HarnessError(f"{label} is larger than {MAX_ARRIVAL_FILE_BYTES // 2**20} MiB; is it the right file?")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"cannot read {label} as UTF-8 text ({exc}); give a JSON or CSV list of arrival "
                           "times") from None
    if path.suffix.lower() == ".json":
        times = _json_times(text, label)
    elif path.suffix.lower() == ".csv":
        times = _csv_times(text, label)
    else:
        raise HarnessError(f"{label} is neither .json nor .csv; give a JSON array or a CSV column of arrival "
                           "times in seconds")
    return checked_times(times, n_requests, label)


def _json_times(text: str, label: str) -> list[Any]:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise HarnessError(f"{label} is not valid JSON; give an array of arrival times like [0.0, 0.5, 1.2]") \
            from None
    if not isinstance(value, list):
        raise HarnessError(f"{label} holds a JSON {type(value).__name__}, not an array of arrival times like "
                           "[0.0, 0.5, 1.2]")
    return value


def _csv_times(text: str, label: str) -> list[Any]:
    rows = [row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]
    if rows and _number(rows[0][0]) is None:  # a header: read its arrival_s column
        header = [cell.strip() for cell in rows[0]]
        if CSV_COLUMN not in header:
            raise HarnessError(f"{label}'s header {','.join(header)!r} names no column {CSV_COLUMN!r}; name the "
                               f"arrival times' column {CSV_COLUMN} (or give one number per line, no header)")
        column = header.index(CSV_COLUMN)
        values = []
        for line, row in enumerate(rows[1:], start=2):
            if column >= len(row):
                raise HarnessError(f"{label} row {line} has no {CSV_COLUMN} value")
            values.append(_number(row[column]) if _number(row[column]) is not None else row[column].strip())
        return values
    values = []
    for line, row in enumerate(rows, start=1):
        if len(row) != 1:
            raise HarnessError(f"{label} row {line} has {len(row)} columns; without a header each line holds one "
                               f"arrival time (or add a header naming the column {CSV_COLUMN})")
        values.append(_number(row[0]) if _number(row[0]) is not None else row[0].strip())
    return values


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def checked_times(values: list[Any], n_requests: int, label: str) -> list[float]:
    """Finite, non-negative, non-decreasing numbers, one per request."""
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise HarnessError(f"{label} entry {i} is {v!r}, not a finite number of seconds")
        if v < 0:
            raise HarnessError(f"{label} entry {i} is {v}, a negative arrival time; times are seconds from the "
                               "start of serving, >= 0")
    if len(values) != n_requests:
        raise HarnessError(f"{label} lists {len(values)} arrival times but the replay serves {n_requests} requests; "
                           "give one time per request (prompt order), or set limit_prompts to match")
    for i, (a, b) in enumerate(pairwise(values), start=1):
        if b < a:
            raise HarnessError(f"{label} entry {i} ({b}) comes before entry {i - 1} ({a}); arrival times are in "
                               "prompt order and never decrease: sort the requests by arrival")
    return [float(v) for v in values]


def hashed_workload(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The workload config as the config hash sees it: the arrival settings at their
    defaults left out, so static runs keep the hash they had before the settings existed."""
    return {k: v for k, v in workload.items() if not (k in ARRIVAL_DEFAULTS and v == ARRIVAL_DEFAULTS[k])}
