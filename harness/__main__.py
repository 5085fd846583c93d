"""`python -m harness [overrides]`: one run, or a sweep with `-m`.

Bad input never shows a traceback (unless HYDRA_FULL_ERROR=1): the overrides are
composed and checked before Hydra starts, and a `HarnessError` during the run becomes
one line on stderr and exit code 2.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.cli_check import precheck
from harness.config import register_configs
from harness.errors import HarnessError

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from harness.run import run_job, summary_lines

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        result = run_job(cfg, run_dir)
    except HarnessError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    for line in summary_lines(result, cfg.show_text):
        print(line)


def entry() -> None:
    try:
        precheck(sys.argv[1:])
    except HarnessError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    entry()
