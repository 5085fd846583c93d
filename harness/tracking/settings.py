"""The `tracking` config node: where results are logged (an MLflow tracking URI) and how."""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import MISSING

from harness.common.errors import HarnessError
from harness.tracking.mlflow_store import DEFAULT_TIMEOUT_S
from harness.tracking.uris import check_tracking_uri

DEFAULT_URI = "sqlite:///outputs/mlflow.db"


@dataclass
class TrackingConfig:
    """Schema of the `tracking` config node."""

    enabled: bool = True
    uri: str = DEFAULT_URI  # sqlite:///path.db, http://host:5000, postgresql://..., ...
    experiment: str | None = None  # null: one experiment per model ("llada2-mini", "qwen3_moe")
    artifact_root: str | None = None  # null: <store dir>/mlartifacts for sqlite, the server's default otherwise
    timeout_s: float = DEFAULT_TIMEOUT_S  # the longest a request to a tracking server may take (no retries)

    def __post_init__(self) -> None:
        """The URI's form and the timeout, before the run (a bad scheme used to be reported after it)."""
        if self.enabled and self.uri != MISSING:
            check_tracking_uri(str(self.uri), "tracking.uri")
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= 600):
            raise HarnessError(f"tracking.timeout_s={self.timeout_s} must be a number of seconds in (0, 600]")
