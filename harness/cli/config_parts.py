"""The typed config's parts that lower modules take (the model, workload, calibration,
trace and tracking nodes): a leaf module, so that harness/cli/config.py (which builds
`HarnessConfig` from them and checks across parts) and the modules that read one part
(harness/model, harness/decode/workload.py, harness/tracking/tracking.py) import it without importing
each other. harness/cli/config.py re-exports every name here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from harness.errors import HarnessError
from harness.tracking.mlflow_store import DEFAULT_TIMEOUT_S
from harness.tracking.uris import check_tracking_uri

MODEL_NAMES = ("tiny", "mini", "flash")
DTYPES = ("float32", "bfloat16")
WEIGHT_KINDS = ("trained", "random")  # proxies: harness/training/store.py
SOURCES = ("live", "trace")
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise HarnessError(message)


def _given(value: Any) -> bool:
    """False for the schema's placeholder of a mandatory value."""
    return value != MISSING


@dataclass
class ModelConfig:
    name: str = MISSING  # tiny | mini | flash
    nominal: str = MISSING  # published geometry (llada2_mini | llada2_flash) or 'proxy' for tiny
    path: str | None = None  # real checkpoint directory; null -> proxy weights
    dtype: str = "float32"  # float32 | bfloat16
    proxy_seed: int = 0
    weights: str = "random"  # proxies only: trained (harness/training) | random (seeded, expert bias balanced)

    def __post_init__(self) -> None:
        _require(not _given(self.name) or self.name in MODEL_NAMES,
                 f"model.name={self.name!r} is not allowed; use one of {', '.join(MODEL_NAMES)}")
        _require(self.weights in WEIGHT_KINDS,
                 f"model.weights={self.weights!r} is not allowed; use trained or random")
        _require(self.dtype in DTYPES, f"model.dtype={self.dtype!r} is not allowed; use one of {', '.join(DTYPES)}")
        _require(0 <= self.proxy_seed <= MAX_SEED, f"model.proxy_seed={self.proxy_seed} must be in [0, 2**63-1]")


@dataclass
class WorkloadConfig:
    name: str = "coding"
    path: str | None = None  # jsonl file (workload=jsonl)
    prompt_field: str = "prompt"  # jsonl (or dataset) key holding the prompt
    prompts: list[str] = field(default_factory=list)
    dataset: str | None = None  # a bundled benchmark: humaneval (harness/decode/workload.py)

    def __post_init__(self) -> None:
        """One source of prompts: a file given with a dataset would be silently ignored."""
        _require(self.path is None or self.dataset is None or self.path == MISSING,
                 f"workload.path={self.path!r} and workload.dataset={self.dataset!r} are both set; a run reads "
                 "one of them: use workload=jsonl workload.path=... or workload=humaneval, not both")


@dataclass
class CalibrationConfig:
    prompts: list[str] = field(default_factory=list)


@dataclass
class TraceConfig:
    path: str | None = None  # replay: a trace.npz; null = the cached trace of this model/workload/decode
    record: bool = False  # live: also save trace.npz (+ calibration.npz) into the run dir
    # which option belongs to which source is checked across parts (HarnessConfig.__post_init__)


DEFAULT_URI = "sqlite:///outputs/mlflow.db"


@dataclass
class TrackingConfig:
    """Schema of the `tracking` config node."""

    enabled: bool = True
    uri: str = DEFAULT_URI  # sqlite:///path.db, http://host:5000, postgresql://..., ...
    experiment: str | None = None  # null: one experiment per model ("llada2-mini")
    artifact_root: str | None = None  # null: <store dir>/mlartifacts for sqlite, the server's default otherwise
    timeout_s: float = DEFAULT_TIMEOUT_S  # the longest a request to a tracking server may take (no retries)

    def __post_init__(self) -> None:
        """The URI's form and the timeout, before the run (a bad scheme used to be reported after it)."""
        if self.enabled and self.uri != MISSING:
            check_tracking_uri(str(self.uri), "tracking.uri")
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= 600):
            raise HarnessError(f"tracking.timeout_s={self.timeout_s} must be a number of seconds in (0, 600]")
