"""`python -m harness [overrides]`: one run, or a sweep with `-m`.

Bad input never shows a traceback (unless HYDRA_FULL_ERROR=1): the overrides are
composed and checked before Hydra starts, and a `HarnessError` during the run becomes
one line on stderr and exit code 2. In a sweep, a job that fails that way writes
`failed.json` into its directory and the sweep goes on; the sweep then exits 2.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.cli import callbacks
from harness.cli.help import help_text
from harness.cli.overrides import precheck, typed_config
from harness.common.errors import HarnessError
from harness.common.files import write_json_atomic
from harness.common.keyvalue import wants_help
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.job.mlflow_log import log_if_missing, record_finished_run, where_lines
from harness.job.resume import resumed_result_path, skip_if_done

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir = HydraConfig.get().runtime.output_dir
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        config = typed_config(cfg)  # below here, only the typed HarnessConfig
        if skip_if_done(config, run_dir):  # resume=true and this config already has a result
            log_if_missing(resumed_result_path(run_dir), config)  # killed before logging: log it now
            return
        result = run_job(config, run_dir)
    except Exception as exc:
        # a HarnessError is bad input; anything else is a bug, which a single run shows in full
        # but a sweep records as that job's failure, so the other jobs and the summary still come
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not (in_sweep or isinstance(exc, HarnessError)):
            raise
        message = str(exc) if isinstance(exc, HarnessError) else \
            f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())[:300]} (a bug: please report it)"
        print(f"error: {message}", file=sys.stderr)
        if in_sweep:
            write_json_atomic(os.path.join(run_dir, "failed.json"), {"error": message})
            return
        sys.exit(2)
    for line in result.summary_lines(config.show_text):
        print(line)
    run_id = record_finished_run(result, run_dir, config)  # resume index + MLflow, after result.json; never raises
    if not in_sweep:  # a sweep prints one line per job and the link to its runs at the end
        for line in where_lines(run_dir, config, run_id):
            print(line)


def entry() -> None:
    """`python -m harness` and the `harness` console script."""
    if wants_help(sys.argv[1:]):  # our help: every group and option in a line (--hydra-help: Hydra's)
        print(help_text())
        sys.exit(0)
    try:
        precheck(sys.argv[1:])
    except HarnessError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    main()

    if callbacks.FAILED_JOBS:
        sys.exit(2)


if __name__ == "__main__":
    entry()
