"""`python -m harness [overrides]`: one run, or a sweep with `-m`.

Bad input never shows a traceback (unless HYDRA_FULL_ERROR=1): the overrides are
composed and checked before Hydra starts, and a `HarnessError` during the run becomes
one line on stderr and exit code 2 (a write that fails on a full or read-only disk too,
naming what the run dir already holds). In a sweep, a job that fails that way writes
`failed.json` into its directory and the sweep goes on; the sweep then exits 2. Ctrl-C
prints one line (what was saved, how to resume) and exits 130.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.cli import callbacks, hydra_files
from harness.cli.help import help_text
from harness.cli.hydra_files import HydraFileFailed
from harness.cli.overrides import precheck, typed_config
from harness.common.errors import HarnessError, OutputError
from harness.common.files import write_json_atomic
from harness.common.interrupts import install_sigint_handler, raise_if_interrupted
from harness.common.keyvalue import wants_help
from harness.common.paths import as_output_error
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.job.mlflow_log import log_if_missing, record_finished_run, where_lines
from harness.job.resume import resumed_result_path, skip_if_done

register_configs()
RUN_DIR: str | None = None  # the run under way (Ctrl-C's line names it)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    global RUN_DIR
    run_dir = RUN_DIR = HydraConfig.get().runtime.output_dir
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    raise_if_interrupted()  # a Ctrl-C that the previous job's code swallowed stops the sweep here
    try:
        config = typed_config(cfg)  # below here, only the typed HarnessConfig
        if skip_if_done(config, run_dir):  # resume=true and this config already has a result
            log_if_missing(resumed_result_path(run_dir), config)  # killed before logging: log it now
            return
        result = run_job(config, run_dir)
    except Exception as exc:
        raise_if_interrupted()  # an exception that stands in for a swallowed Ctrl-C is not the job's failure
        # a HarnessError is bad input; anything else is a bug, which a single run shows in full
        # but a sweep records as that job's failure, so the other jobs and the summary still come
        exc = as_output_error(exc)  # a full disk or a read-only file system: one line, not a bug
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not (in_sweep or isinstance(exc, HarnessError)):
            raise
        message = str(exc) if isinstance(exc, HarnessError) else \
            f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())[:300]} (a bug: please report it)"
        if isinstance(exc, OutputError):
            message += f"; saved in {run_dir}: {saved_files(run_dir)}"
        if in_sweep:  # the sweep prints it as the job's `[failed]` line, and again in its summary
            try:
                write_json_atomic(os.path.join(run_dir, "failed.json"), {"error": message})
            except OSError:  # on a full disk failed.json may not fit either: say it here
                print(f"error: {message}", file=sys.stderr)
            return
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    for line in result.summary_lines(config.show_text, config.show_wall):
        print(line)
    run_id = record_finished_run(result, run_dir, config)  # resume index + MLflow, after result.json; never raises
    raise_if_interrupted()
    if not in_sweep:  # a sweep prints one line per job and the link to its runs at the end
        for line in where_lines(run_dir, config, run_id):
            print(line)


def entry() -> None:
    """`python -m harness` and the `harness` console script."""
    if wants_help(sys.argv[1:]):  # our help: every group and option in a line (--hydra-help: Hydra's)
        print(help_text())
        sys.exit(0)
    try:
        # Hydra reads sys.argv: glob sweeps expanded, sweep.max_jobs taken out (harness/cli/argv_check.py)
        sys.argv = [sys.argv[0], *precheck(sys.argv[1:])]
    except HarnessError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    install_sigint_handler()
    hydra_files.install()  # Hydra's .hydra/*.yaml written atomically, a full disk there one line
    try:
        main()
        raise_if_interrupted()
    except HydraFileFailed as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"interrupted: {interrupted_note()}", file=sys.stderr)
        sys.exit(130)

    if callbacks.FAILED_JOBS:
        sys.exit(2)


def saved_files(run_dir: str | os.PathLike) -> str:
    """The files a run dir holds (Hydra's .hydra aside), for the line of a failed write."""
    try:
        names = sorted(p.name for p in Path(run_dir).iterdir() if p.is_file() and not p.name.startswith("."))
    except OSError:
        names = []
    return ", ".join(names) or "nothing"


def interrupted_note() -> str:
    """What a Ctrl-C leaves: every file is written atomically, so only finished results exist."""
    sweep = callbacks.SWEEP_DIR
    if sweep is not None:
        return (f"the finished jobs' results are in {sweep} (its MLflow parent run, if any, ends KILLED); run the "
                f"same command with resume=true hydra.sweep.dir={sweep} to finish the rest")
    where = f" in {RUN_DIR}" if RUN_DIR else ""
    return f"this run wrote no result.json{where} (cached models and traces that were complete are kept); run it again"


if __name__ == "__main__":
    entry()
