"""Hydra callback for sweeps (registered in conf/config.yaml under hydra.callbacks).

  on_multirun_start  (launching process) create the sweep's parent MLflow run and record
                     its id in <sweep dir>/mlflow_parent.json, where every job, in
                     whatever process or node runs it, finds it (harness.tracking)
  on_job_end         (the job's process) one compact line per finished job
  on_multirun_end    (launching process) the sweep's summary table: printed, written to
                     the sweep dir (CSV, markdown, throughput plot) and logged to the
                     parent run, which is then closed

Hydra turns an exception in a callback into a warning; these methods also catch their
own store failures so that a sweep never stops because MLflow is unreachable.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness import tracking
from harness.report import SWEEP_FILES, compact_line, record_from_result, sweep_markdown, sweep_records, sweep_table
from harness.results import read_json

SUMMARY_CSV, SUMMARY_MD, THROUGHPUT_PNG = SWEEP_FILES


FAILED_JOBS = 0  # set by the last sweep in this process; `python -m harness` then exits 2


def swept_models(config: DictConfig) -> set[str]:
    """The model names a sweep will run (a `model=a,b` override lists several)."""
    overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        if ov.get_key_element() in ("model", "+model") and ov.is_sweep_override():
            return {str(v) for v in ov.sweep_string_iterator()}
    return {str(config.model.name)}


def sweep_dir(config: DictConfig) -> Path:
    return Path(str(config.hydra.sweep.dir))


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        directory = sweep_dir(config)
        directory.mkdir(parents=True, exist_ok=True)
        settings = tracking.tracking_settings(config)
        if not settings.enabled:
            return
        overrides = [str(o) for o in config.hydra.overrides.task]
        try:
            run_id = tracking.start_parent_run(settings, directory, swept_models(config), overrides)
            print(f"sweep {directory}: MLflow parent run {run_id} ({tracking.normalize_uri(settings.uri)})")
        except Exception as exc:
            tracking.warn_failure(settings.uri, "parent run", exc)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return  # a single run already printed its summary
        run_dir = Path(str(config.hydra.runtime.output_dir))
        label = f"#{config.hydra.job.num}"
        if (run_dir / "failed.json").is_file():  # a HarnessError, already printed as one line
            print(f"[failed] {label}: {read_json(run_dir / 'failed.json')['error']}", flush=True)
        elif job_return.status == JobStatus.FAILED:
            reason = " ".join(str(job_return._return_value).split())[:200]
            print(f"[failed] {label}: {type(job_return._return_value).__name__}: {reason}", flush=True)
        elif (run_dir / "result.json").is_file():
            record = record_from_result(read_json(run_dir / "result.json"), str(run_dir))
            print(compact_line(record, label), flush=True)
        # a job skipped by resume printed its own line

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        directory = sweep_dir(config)
        records = sweep_records(directory)
        global FAILED_JOBS
        FAILED_JOBS = sum(r["status"] == "failed" for r in records)
        if not records:
            return
        files = write_sweep_summary(directory, records)
        print(f"sweep summary ({directory}):")
        print((directory / SUMMARY_MD).read_text(), end="")
        settings = tracking.tracking_settings(config)
        run_id = tracking.parent_run_id(directory, settings.uri) if settings.enabled else None
        if run_id is None:
            return
        try:
            tracking.finish_parent_run(settings, run_id, files, sweep_metrics(records))
        except Exception as exc:
            tracking.warn_failure(settings.uri, "sweep summary", exc)


def write_sweep_summary(directory: Path, records: list[dict[str, Any]]) -> list[Path]:
    from harness.plots import throughput_by_budget

    table = sweep_table(records)
    table.to_csv(directory / SUMMARY_CSV, index=False)
    (directory / SUMMARY_MD).write_text(sweep_markdown(table))
    done = [r for r in records if r["status"] != "failed"]
    plot = throughput_by_budget(done, directory / THROUGHPUT_PNG) if done else None
    return [directory / SUMMARY_CSV, directory / SUMMARY_MD] + ([plot] if plot else [])


def sweep_metrics(records: list[dict[str, Any]]) -> dict[str, float]:
    count = {s: float(sum(r["status"] == s for r in records)) for s in ("ok", "skipped", "failed")}
    best = max((r["tokens_per_s"] for r in records if not math.isnan(r["tokens_per_s"])), default=math.nan)
    return {"jobs": float(len(records)), "jobs_ok": count["ok"], "jobs_skipped": count["skipped"],
            "jobs_failed": count["failed"], **({"best_tokens_per_s": best} if not math.isnan(best) else {})}
