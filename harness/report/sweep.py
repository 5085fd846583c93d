"""A sweep's summary (printed at its end, sweep_summary.md and .csv in the sweep dir, the
parent run's description in MLflow): one record per job directory, ok, skipped (resume) or
failed, and the table of them (harness/cli/callbacks.py writes it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness.job.resume import resumed_result_path
from harness.report.markdown import pipe_table
from harness.report.tables import LABELS, cell_text, harness_result
from harness.results.records import record_from_result
from harness.results.run_result import RunIdentity, RunResult

SWEEP_COLUMNS = ["job", "overrides", "status", "system", "budget", "model", "gen_length", "block_length",
                 "decode_cache", "tau", "tokens_per_s", "miss_rate", "io_gb", "cpu_expert_tokens", "tau_star",
                 "lossless", "token_match_rate", "wall_tokens_per_s", "timing", "weights"]
# the sweep summary's headers, with their units (the values carry % themselves)
SWEEP_HEADERS = {"tokens_per_s": "{timing} tok/s", "wall_tokens_per_s": "wall tok/s (this machine)",
                 "io_gb": "host-to-GPU GB", "cpu_expert_tokens": "CPU expert tokens", "tau_star": "tau* (steps)",
                 "miss_rate": "miss rate", "token_match_rate": "token match"}
# columns that name a job rather than measure it: said once below the table when every job agrees
SWEEP_SHARED = ("status", "system", "budget", "model", "gen_length", "block_length", "decode_cache", "tau", "timing",
                "weights", "lossless")


def _job_number(name: str) -> tuple[int, str]:
    found = re.match(r"(\d+)", name)
    return (int(found.group(1)) if found else 1 << 30, name)


def _job_overrides(job_dir: Path) -> dict[str, str]:
    try:
        items = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
    except (OSError, yaml.YAMLError):
        return {}
    return dict(str(o).split("=", 1) for o in items if "=" in str(o))


def varying_overrides(overrides: list[dict[str, str]]) -> list[str]:
    """'key=value' per job for the keys whose value differs between the jobs of a sweep."""
    keys = sorted({k for o in overrides for k in o})
    varying = [k for k in keys if len({o.get(k) for o in overrides}) > 1]
    return [" ".join(f"{k}={o[k]}" for k in varying if k in o) for o in overrides]


def sweep_records(sweep_dir: Path) -> list[dict[str, Any]]:
    """One record per job directory of a sweep: ok, skipped (resume) or failed."""

    records = []
    job_dirs = sorted({p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")},
                      key=lambda d: _job_number(str(d.relative_to(sweep_dir))))
    labels = varying_overrides([_job_overrides(d) for d in job_dirs])
    for job, varies in zip(job_dirs, labels, strict=True):
        prior = resumed_result_path(job)
        path, status = (job / "result.json", "ok") if (job / "result.json").is_file() else (prior, "skipped")
        try:
            record = record_from_result(harness_result(path), str(path), status=status)
        except (OSError, ValueError, TypeError, AttributeError):
            record = record_from_result(RunResult(RunIdentity()), str(job), status="failed")
        records.append({**record, "job": _job_number(job.name)[0], "overrides": varies})
    return records


def sweep_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(records)
    return df.reindex(columns=SWEEP_COLUMNS)


def sweep_markdown(table: pd.DataFrame) -> str:
    """The sweep's summary: a row per job, the columns that differ between jobs with their
    units; what every job shares in one line below; this machine's wall tokens/s only where a
    figure is not modeled or the weights are real (on proxies it ranks this CPU, not the
    modeled hardware)."""
    columns = [c for c in table.columns if table[c].notna().any()]
    timings = set(table["timing"].dropna().astype(str)) if "timing" in table else set()
    real = "real" in set(table.get("weights", pd.Series(dtype=object)).dropna().astype(str))
    if timings <= {"modeled"} and not real:
        columns = [c for c in columns if c != "wall_tokens_per_s"]
    shared = [c for c in columns if c in SWEEP_SHARED and len(table) > 1 and table[c].astype(str).nunique() == 1]
    shown = [c for c in columns if c not in shared and c != "weights"]
    timing = "/".join(sorted(timings)) or "?"
    headers = [SWEEP_HEADERS.get(c, LABELS.get(c, c)).format(timing=timing) for c in shown]
    text = pipe_table(headers, [[cell_text(c, row[c]) for c in shown] for _, row in table.iterrows()])
    if shared:
        first = table.iloc[0]
        text += "\nevery job: " + ", ".join(f"{LABELS.get(c, c)}={cell_text(c, first[c])}" for c in shared) + "\n"
    return text
