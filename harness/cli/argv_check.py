"""The command line's shape, before any override is composed (docs/bad-input.md).

Hydra answers an unknown flag or a missing `--config-name` with its own usage text and exit
code 1, cannot expand a `glob(...)` sweep without its config loader, and enumerates a
`range(0,100000000)` sweep value by value before printing anything. Here:

- flags: only Hydra's own; anything else is one line;
- `--config-name`: a config of conf/;
- glob sweeps over a config group are expanded to the group's options (`system=glob(tide*)`
  becomes `system=tide,tide_adaptive,tide_sequential`), so the precheck, the sweep callback
  and Hydra all see the same list;
- the number of jobs is counted without enumerating ranges; more than `sweep.max_jobs`
  (10,000 unless given on the command line, where this module removes it) is refused;
- a key given twice with different values (`decode.gen_length=16 ... decode.gen_length=32`,
  of which Hydra silently keeps the last) is refused, naming both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException

from harness.cli.hints import group_options
from harness.common.errors import HarnessError

MAX_JOBS_KEY = "sweep.max_jobs"
DEFAULT_MAX_JOBS = 10_000
# Hydra's command-line flags (hydra/_internal/utils.py get_args_parser), with and without a value
FLAGS_WITH_VALUE = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-p", "--package",
                    "--experimental-rerun", "-c", "--cfg"}
FLAGS = {"-h", "--help", "--hydra-help", "--version", "--resolve", "-r", "--run", "-m", "--multirun", "-sc",
         "--shell-completion", "-i", "--info"}


def split_max_jobs(argv: list[str]) -> tuple[list[str], int]:
    """(argv without `sweep.max_jobs=N`, N or the default)."""
    rest, limit = [], DEFAULT_MAX_JOBS
    for arg in argv:
        key, sep, value = arg.partition("=")
        if key.lstrip("+") != MAX_JOBS_KEY:
            rest.append(arg)
            continue
        if not sep or not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise HarnessError(f"{MAX_JOBS_KEY}={value!r} must be a positive number of jobs")
        limit = int(value)
    return rest, limit


def check_flags(argv: list[str], conf_dir: Path) -> None:
    """Every argument starting with '-' is one of Hydra's flags; a config name is a config of conf/."""
    expect_value = None
    for arg in argv:
        if expect_value is not None:
            _check_flag_value(expect_value, arg, conf_dir)
            expect_value = None
            continue
        if not arg.startswith("-"):
            continue
        flag, sep, value = arg.partition("=")
        if flag in FLAGS_WITH_VALUE:
            if sep:
                _check_flag_value(flag, value, conf_dir)
            else:
                expect_value = flag
        elif flag not in FLAGS or (sep and flag not in ("-i", "--info")):
            raise HarnessError(f"unknown option {arg!r}; python -m harness takes key=value overrides, -m for a "
                               "sweep and Hydra's flags (see python -m harness --help)")
    if expect_value is not None:
        raise HarnessError(f"option {expect_value} needs a value")


def _check_flag_value(flag: str, value: str, conf_dir: Path) -> None:
    if flag in ("-cn", "--config-name"):
        name = value.removesuffix(".yaml")
        known = sorted(p.stem for p in conf_dir.glob("*.yaml"))
        if name not in known:
            raise HarnessError(f"{flag} {value}: no such config in {conf_dir}; use one of {', '.join(known)}")


def parse(overrides: list[str]) -> list[Override]:
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return []  # the override check names the one it cannot parse


def expand_globs(argv: list[str], conf_dir: Path) -> list[str]:
    """argv with every `group=glob(...)` override replaced by the group's matching options."""
    out = []
    for arg in argv:
        parsed = parse([arg]) if not arg.startswith("-") else []
        if not parsed or parsed[0].value_type != ValueType.GLOB_CHOICE_SWEEP:
            out.append(arg)
            continue
        override = parsed[0]
        key = arg.split("=", 1)[0]
        options = group_options(override.key_or_group, conf_dir)
        if not options:
            raise HarnessError(f"{arg}: glob() sweeps the options of a config group, and {override.key_or_group} "
                               "is not one; list the values instead (key=a,b,c)")
        chosen = override.value().filter(options)
        if not chosen:
            raise HarnessError(f"{arg} matches no option of group {override.key_or_group}; its options are "
                               f"{', '.join(options)}")
        out.append(f"{key}={','.join(chosen)}")
    return out


def sweep_length(override: Override) -> int:
    """How many values a sweep override has, without enumerating a range."""
    value = override.value()
    if override.value_type == ValueType.RANGE_SWEEP:
        if value.step == 0:
            raise HarnessError(f"{override.input_line}: a range needs a non-zero step")
        return max(0, math.ceil((value.stop - value.start) / value.step))
    if override.value_type in (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP):
        return len(value.list)
    raise HarnessError(f"{override.input_line}: this sweep form is not supported by the basic sweeper; "
                       "list the values (key=a,b,c) or use range(start,stop,step)")


def count_jobs(overrides: list[str]) -> int:
    jobs = 1
    for override in parse(overrides):
        if override.is_sweep_override():
            jobs *= sweep_length(override)
    return jobs


def check_job_count(overrides: list[str], limit: int) -> None:
    jobs = count_jobs(overrides)
    if jobs == 0:
        raise HarnessError("the sweep has no jobs (an empty range or list); check the swept values")
    if jobs > limit:
        raise HarnessError(f"the sweep has {jobs:,} jobs, more than {MAX_JOBS_KEY}={limit:,}; narrow it, or add "
                           f"{MAX_JOBS_KEY}={jobs} to the command line if you mean it")


def range_ends(override: Override) -> list[Any]:
    """The first and last value of a range sweep: ranges are checked at their ends (every
    range check is an interval), not value by value."""
    value = override.value()
    n = sweep_length(override)
    last = value.start + (n - 1) * value.step
    if isinstance(value.start, int) and isinstance(value.step, int):
        return [value.start, last] if n > 1 else [value.start]
    return [float(value.start), float(last)] if n > 1 else [float(value.start)]


def check_repeated_keys(overrides: list[str]) -> None:
    """One value per key: Hydra keeps the last of two and says nothing, so a long command
    line that sets a key twice runs something else than one of its readers thinks."""
    seen: dict[str, str] = {}
    for override in overrides:
        if "=" not in override or override.startswith("~"):
            continue
        key = override.split("=", 1)[0].lstrip("+")
        if key in seen and seen[key] != override.lstrip("+"):
            raise HarnessError(f"{key} is given twice ({seen[key]} and {override.lstrip('+')}); give it once (for a "
                               f"sweep over both values: -m {key}={seen[key].split('=', 1)[1]},"
                               f"{override.split('=', 1)[1]})")
        seen[key] = override.lstrip("+")
