"""`resume=true`: skip a job whose result already exists for the same config.

A job's identity is its config hash: the resolved config without the keys that say where
or how things are recorded (hydra, tracking, resume, cache_dir, show_text), without
the workload's arrival settings where they are at their defaults (static batches), so that
adding them kept every earlier run's hash (harness/traces/arrival_times.py), and without the
`routing` option while it is the default `recorded` (the model's own routing: what every run
replayed before generated routing existed, so their results keep their hashes;
docs/routing-regimes.md). After every
finished job an index file `<cache_dir>/results/<hash>.json` is written atomically,
pointing at its result.json. A sweep that is run again (which gets a new timestamped
sweep dir) therefore finds the results of the earlier, interrupted sweep wherever they
are. A job killed between result.json and its index entry is found by its own run dir when
the sweep is resumed in the same sweep dir. A skipped job writes `resumed.json` into its
own run dir, pointing at the result it reuses, so the sweep's summary still lists it. The
code is not part of the hash, but a result is reused only if it was produced by the same
code (`versions.code` in result.json, a digest of every harness and systems source file):
after a code change, resume reruns.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from harness.common.errors import HarnessError
from harness.common.files import fingerprint, read_json, write_json_atomic
from harness.hybrid.backend import resolve_backend
from harness.job.artifacts import code_version
from harness.results.records import compact_line, record_from_result
from harness.results.run_result import RunResult
from harness.routing.named import RECORDED
from harness.traces.arrival_times import hashed_workload

if TYPE_CHECKING:
    from harness.job.config import HarnessConfig

HASH_EXCLUDED_KEYS = ("hydra", "tracking", "resume", "cache_dir", "show_text", "show_wall")
RESUMED_FILE = "resumed.json"


def _hashed_workload(workload: Any) -> Any:
    return hashed_workload(workload) if isinstance(workload, Mapping) else workload


def _hashed_routing(routing: Any) -> Any:
    """The default routing (`recorded`) reads no other field of its group: no identity at all."""
    return None if isinstance(routing, Mapping) and routing.get("name") == RECORDED else routing


# Config groups that gained settings after results existed, as the hash sees them: at their
# defaults the new settings leave the identity (None: the whole group), so earlier results
# keep their hashes (module docstring).
LATER_SETTINGS: dict[str, Callable[[Any], Any]] = {"workload": _hashed_workload, "routing": _hashed_routing}


def config_hash(config: Mapping[str, Any], backend: str | None = None) -> str:
    """Hash of what determines a result. `backend=auto` means different runs on a CPU-only
    and on a GPU machine, so it is replaced by the backend used (`backend`, e.g. a result's
    own "backend"), or else by the one this machine resolves to."""
    identity = {k: v for k, v in config.items() if k not in HASH_EXCLUDED_KEYS}
    for key, as_hashed in LATER_SETTINGS.items():
        value = as_hashed(identity.get(key))
        if value is None:
            identity.pop(key, None)
        else:
            identity[key] = value
    if identity.get("backend") == "auto":
        identity["backend"] = backend or _local_backend()
    return fingerprint(identity)


def _local_backend() -> str:
    return resolve_backend("auto")


def index_path(cache_dir: str | Path, digest: str) -> Path:
    return Path(cache_dir) / "results" / f"{digest}.json"


def index_result(config: Mapping[str, Any], run_dir: str | Path, cache_dir: str | Path,
                 backend: str | None = None) -> Path:
    """Point the index entry of this config at the result.json just written."""
    digest = config_hash(config, backend)
    entry = {"config_hash": digest, "result": str((Path(run_dir) / "result.json").resolve()), "indexed_at": time.time()}
    return write_json_atomic(index_path(cache_dir, digest), entry)


def prior_result(config: Mapping[str, Any], cache_dir: str | Path, run_dir: str | Path | None = None) -> Path | None:
    """The result.json of an earlier run of this exact config by this code, if it is still
    there and intact: the one indexed in the cache dir, or else the one already in this
    job's own run dir (a job killed after writing result.json but before its index entry,
    resumed in the same sweep dir)."""
    digest = config_hash(config)
    candidates = []
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # no entry, a damaged one
        candidates.append(Path(read_json(index_path(cache_dir, digest))["result"]))
    if run_dir is not None:
        candidates.append((Path(run_dir) / "result.json").resolve())
    return next((path for path in candidates if _reusable(path, digest)), None)


def _reusable(path: Path, digest: str) -> bool:
    try:
        prior = RunResult.from_json(path)
        same_code = prior.versions.get("code") == code_version()
        return same_code and config_hash(prior.config, prior.identity.backend) == digest
    except (OSError, ValueError, KeyError, TypeError, AttributeError, HarnessError):
        return False  # a moved, damaged or foreign result: run the job again


def note_resumed(run_dir: str | Path, prior: Path, digest: str) -> Path:
    return write_json_atomic(Path(run_dir) / RESUMED_FILE, {"config_hash": digest, "result": str(prior)})


def resumed_result_path(run_dir: str | Path) -> Path | None:
    try:
        return Path(read_json(Path(run_dir) / RESUMED_FILE)["result"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def skip_if_done(cfg: HarnessConfig, run_dir: str | Path) -> bool:
    """With resume=true and an earlier result for this config: note it, print one line, True."""
    if not cfg.resume:
        return False
    config = cfg.as_dict()
    prior = prior_result(config, cfg.cache_dir, run_dir)
    if prior is None:
        return False
    note_resumed(run_dir, prior, config_hash(config))

    record = record_from_result(RunResult.from_json(prior), str(prior), status="skipped")
    print(f"{compact_line(record, job_label(run_dir))} | reuses {prior}", flush=True)
    return True


def job_label(run_dir: str | Path) -> str:
    """'#3' for the fourth job of a sweep, else the run dir's name."""

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return f"#{HydraConfig.get().job.num}"
    return Path(run_dir).name
