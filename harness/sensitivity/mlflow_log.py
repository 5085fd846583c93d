"""The sensitivity analysis under its sweep's MLflow parent run: the files as artifacts
(sensitivity/), per cell and constant the factors that flip the winner or move the margin
as metrics, a tag. A store that cannot be reached costs one warning, as everywhere."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.common.errors import HarnessError
from harness.common.files import read_json
from harness.sensitivity.analysis import Roles
from harness.sensitivity.cells import CellResult
from harness.sensitivity.output import slug
from harness.tracking.mlflow_store import open_store, warn_failure
from harness.tracking.run_files import PARENT_MARKER, RESULT_FILE, parent_run_id


def sweep_uri(sweep: Path) -> str:
    """The tracking URI the sweep's jobs logged to (from a result's config)."""
    for result in sorted(sweep.glob(f"*/{RESULT_FILE}")):
        tracking = (read_json(result).get("config") or {}).get("tracking") or {}
        if tracking.get("uri"):
            return str(tracking["uri"])
    raise HarnessError(f"no result in {sweep} names its tracking URI")


def metrics(cells: Sequence[CellResult], roles: Roles) -> dict[str, float]:
    out: dict[str, float] = {}
    for cell in cells:
        name = slug(cell.name)
        out[f"sensitivity.{name}.margin"] = roles.margin(cell.base)
        for r in cell.constants:
            for which in ("winner_down", "winner_up", "margin_down", "margin_up"):
                factor = getattr(r, which).factor
                if factor is not None:
                    out[f"sensitivity.{name}.{r.constant}.{which}"] = factor
    return out


def log_to_parent(sweep: Path, cells: Sequence[CellResult], roles: Roles, files: Sequence[Path]) -> str | None:
    """Log under the parent run named by the sweep's marker; None (and a line) without one."""
    try:
        uri = sweep_uri(sweep)
    except HarnessError as exc:
        print(f"warning: not logged to MLflow: {exc}", file=sys.stderr)
        return None
    run_id = parent_run_id(sweep, uri)
    if run_id is None:
        print(f"warning: not logged to MLflow: {sweep / PARENT_MARKER} names no parent run in {uri}", file=sys.stderr)
        return None
    try:
        client = open_store(uri)
        for path in files:
            client.log_artifact(run_id, str(path), "sensitivity")
        for key, value in metrics(cells, roles).items():
            client.log_metric(run_id, key, value)
        client.set_tag(run_id, "harness.sensitivity", "sensitivity/sensitivity.md")
    except Exception as exc:  # a store problem must not lose the files already written
        warn_failure(uri, "sensitivity logging", exc)
        return None
    print(f"logged to MLflow parent run {run_id} ({uri})", file=sys.stderr)
    return run_id
