"""`resume=true`: skip a job whose result already exists for the same config.

A job's identity is its config hash: the resolved config without the keys that say where
or how things are recorded (hydra, tracking, resume, cache_dir, show_text). After every
finished job an index file `<cache_dir>/results/<hash>.json` is written atomically,
pointing at its result.json. A sweep that is run again (which gets a new timestamped
sweep dir) therefore finds the results of the earlier, interrupted sweep wherever they
are. A skipped job writes `resumed.json` into its own run dir, pointing at the result it
reuses, so the sweep's summary still lists it. The code is not part of the hash, but a
result is reused only if it was produced by the same code (`versions.code` in result.json,
a digest of every harness and systems source file): after a code change, resume reruns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.result import RunResult
from harness.results import fingerprint, read_json, write_json_atomic

if TYPE_CHECKING:
    from harness.config import HarnessConfig

HASH_EXCLUDED_KEYS = ("hydra", "tracking", "resume", "cache_dir", "show_text")
RESUMED_FILE = "resumed.json"


def config_hash(config: Mapping[str, Any], backend: str | None = None) -> str:
    """Hash of what determines a result. `backend=auto` means different runs on a CPU-only
    and on a GPU machine, so it is replaced by the backend used (`backend`, e.g. a result's
    own "backend"), or else by the one this machine resolves to."""
    identity = {k: v for k, v in config.items() if k not in HASH_EXCLUDED_KEYS}
    if identity.get("backend") == "auto":
        identity["backend"] = backend or _local_backend()
    return fingerprint(identity)


def _local_backend() -> str:
    from harness.hybrid.backend import resolve_backend

    return resolve_backend("auto")


def index_path(cache_dir: str | Path, digest: str) -> Path:
    return Path(cache_dir) / "results" / f"{digest}.json"


def index_result(config: Mapping[str, Any], run_dir: str | Path, cache_dir: str | Path,
                 backend: str | None = None) -> Path:
    """Point the index entry of this config at the result.json just written."""
    digest = config_hash(config, backend)
    entry = {"config_hash": digest, "result": str((Path(run_dir) / "result.json").resolve()), "indexed_at": time.time()}
    return write_json_atomic(index_path(cache_dir, digest), entry)


def prior_result(config: Mapping[str, Any], cache_dir: str | Path) -> Path | None:
    """The result.json of an earlier run of this exact config by this code, if it is still
    there and intact."""
    from harness.artifacts import code_version

    digest = config_hash(config)
    try:
        path = Path(read_json(index_path(cache_dir, digest))["result"])
        prior = RunResult.from_json(path)
        same_code = prior.versions.get("code") == code_version()
        if same_code and config_hash(prior.config, prior.identity.backend) == digest:
            return path
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no entry, a moved or damaged result: run the job again
    return None


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
    prior = prior_result(config, cfg.cache_dir)
    if prior is None:
        return False
    note_resumed(run_dir, prior, config_hash(config))
    from harness.report import compact_line, record_from_result

    record = record_from_result(RunResult.from_json(prior), str(prior), status="skipped")
    print(f"{compact_line(record, job_label(run_dir))} | reuses {prior}", flush=True)
    return True


def job_label(run_dir: str | Path) -> str:
    """'#3' for the fourth job of a sweep, else the run dir's name."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return f"#{HydraConfig.get().job.num}"
    return Path(run_dir).name
