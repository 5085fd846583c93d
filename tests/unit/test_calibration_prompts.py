"""calibration.from_workload: calibrate on the last N prompts of the workload's own dataset,
never on one the run decodes; refused in one line when the dataset has too few left."""

from __future__ import annotations

import pytest

from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.decode.workload import read_humaneval_prompts
from harness.job.artifacts import calibration_prompts
from harness.job.config import register_configs

register_configs()


def test_the_default_is_the_listed_prompts() -> None:
    cfg = compose_checked(["model=tiny"])
    assert calibration_prompts(cfg) == list(cfg.calibration.prompts) and cfg.calibration.from_workload == 0


def test_from_workload_takes_the_datasets_last_prompts_which_the_run_never_decodes() -> None:
    cfg = compose_checked(["model=tiny", "workload=humaneval", "limit_prompts=8", "calibration.from_workload=4"])
    every = read_humaneval_prompts()
    assert calibration_prompts(cfg) == every[-4:]
    assert not set(calibration_prompts(cfg)) & set(every[:8])


def test_too_few_prompts_left_is_one_line() -> None:
    cfg = compose_checked(["model=tiny", "workload=humaneval", "limit_prompts=162", "calibration.from_workload=4"])
    with pytest.raises(HarnessError, match=r"calibration.from_workload=4 needs 4 prompts the run does not decode.*"
                                           r"has 164 and the run decodes 162"):
        calibration_prompts(cfg)


@pytest.mark.parametrize("value", ["-1", "true"])
def test_a_bad_count_is_refused(value: str) -> None:
    with pytest.raises(HarnessError, match=r"calibration\.from_workload"):
        compose_checked(["model=tiny", f"calibration.from_workload={value}"])
