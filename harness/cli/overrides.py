"""Check the command line before Hydra runs it.

Hydra reports a bad override (unknown group option, wrong type, unknown key) in several
lines and exit code 1. The harness composes every override here first, each sweep value
once, types it (`typed_config`: the config dataclasses check their values) and reports
the first problem as one line naming the key and what is allowed, so a sweep never
starts with a typo in its tenth job. Before that, the command line's shape (flags, glob
sweeps, the number of jobs: harness/cli/argv_check.py); after it, the output locations
(run or sweep dir, cache dir) and the tracking store (harness/common/paths.py, docs/bad-input.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.cli.argv_check import (
    check_flags,
    check_job_count,
    check_repeated_keys,
    expand_globs,
    range_ends,
    split_max_jobs,
)
from harness.cli.hints import config_keys, refuse_schema_options, refuse_sweep_without_multirun, with_hint
from harness.common.errors import HarnessError
from harness.common.paths import probe_output_dir, probe_output_parent
from harness.job.config import HarnessConfig, register_configs
from harness.tracking.uris import check_store_is_mlflow

CONF_DIR = str(Path(__file__).resolve().parent.parent.parent / "conf")
_FLAGS_WITH_VALUE = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-p", "--package"}
_SKIP_ALL = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "--shell-completion", "-sc"}


def user_overrides(argv: list[str]) -> list[str] | None:
    """The overrides in argv that compose the job config; None when Hydra will not run a job."""
    out, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        if arg in _SKIP_ALL or arg.split("=")[0] in _SKIP_ALL:
            return None
        if arg in _FLAGS_WITH_VALUE:
            skip_next = True
            continue
        if arg.startswith("-"):
            continue
        if arg.lstrip("+~").startswith("hydra"):
            continue  # Hydra's own settings (launcher, sweeper, run dir)
        out.append(arg)
    return out


def override_variants(overrides: list[str]) -> list[list[str]]:
    """One override list per sweep value (others at their first value): linear, not a grid.
    A range sweep contributes its two ends only (argv_check.range_ends)."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise HarnessError(_bad_override(overrides, exc)) from None
    base, sweeps = [], []
    for ov in parsed:
        if ov.is_sweep_override():
            key = ov.get_key_element()
            if ov.value_type == ValueType.RANGE_SWEEP:
                values = [f"{key}={v}" for v in range_ends(ov)]
            else:
                values = [f"{key}={v}" for v in ov.sweep_string_iterator()]
            sweeps.append((len(base), values))
            base.append(values[0])
        else:
            base.append(ov.input_line)
    variants = [base]
    for pos, values in sweeps:
        for v in values[1:]:
            variants.append([*base[:pos], v, *base[pos + 1 :]])
    return variants


def typed_config(cfg: DictConfig) -> HarnessConfig:
    """The composed config as a HarnessConfig: interpolations resolved, each part its
    dataclass (value checks run in their __post_init__); any problem is a one-line
    HarnessError. Nothing below the entry point sees the DictConfig."""
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise HarnessError(one_line(exc)) from None
    if not isinstance(typed, HarnessConfig):
        raise HarnessError(f"the composed config is a {type(typed).__name__}, not a HarnessConfig; "
                           "conf/config.yaml must list base_config first in its defaults")
    return typed


def compose_checked(overrides: list[str]) -> HarnessConfig:
    """Compose the job config for these overrides and type it; any problem is a one-line
    HarnessError."""
    return typed_config(compose_raw(overrides))


def compose_raw(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """The composed, untyped job config (what Hydra hands `main`; with `with_hydra`, its
    `hydra` node too); problems are one-line HarnessErrors. The schemas are registered here,
    so that every caller (tests, the API, the analysis commands) composes what the CLI does."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=with_hydra)
    except MissingConfigException as exc:
        raise HarnessError(_missing_option(exc)) from None
    except (HydraException, OmegaConfBaseException, ValueError) as exc:  # ValueError: decode=8 (a group, a number)
        raise HarnessError(one_line(exc)) from None
    finally:
        GlobalHydra.instance().clear()
    return cfg


def precheck(argv: list[str]) -> list[str]:
    """Check the command line: its flags, the size of the sweep, every override (each sweep
    value; the common mistakes answered with their fix, harness/cli/hints.py), then the
    output locations. Returns the argv for Hydra: glob sweeps expanded and `sweep.max_jobs`
    removed (harness/cli/argv_check.py)."""
    argv, max_jobs = split_max_jobs(argv)
    check_flags(argv, Path(CONF_DIR))
    argv = expand_globs(argv, Path(CONF_DIR))
    overrides = user_overrides(argv)
    if overrides is None:
        return argv
    check_repeated_keys(overrides)
    refuse_schema_options(overrides)
    refuse_sweep_without_multirun(argv, overrides)
    check_job_count(overrides, max_jobs)
    variants = override_variants(overrides)
    for variant in variants:
        compose_with_hints(variant)
    probe_outputs(argv, variants[0])
    return argv


def compose_with_hints(overrides: list[str]) -> HarnessConfig:
    """compose_checked, its error completed by the fix it calls for (harness/cli/hints.py)."""
    try:
        return compose_checked(overrides)
    except HarnessError as exc:
        raise HarnessError(with_hint(str(exc), overrides, keys_under)) from None


def keys_under(parent: str) -> list[str]:
    """The keys of the default config under `parent` (for "did you mean")."""
    return config_keys(compose_raw([]), parent)


def probe_outputs(argv: list[str], overrides: list[str]) -> None:
    """The run dir (or the sweep dir) and the cache dir are created and written to now, and
    a SQLite tracking store is MLflow's: not after minutes of work (harness/common/paths.py)."""
    hydra_overrides = [a for a in argv if not a.startswith("-") and a.lstrip("+~").startswith("hydra")]
    cfg = compose_raw([*overrides, *hydra_overrides], with_hydra=True)
    try:
        multirun = "-m" in argv or "--multirun" in argv or str(cfg.hydra.mode) == "RunMode.MULTIRUN"
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        directory = str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir)
        cache_dir, tracking = str(cfg.cache_dir), cfg.tracking
    except OmegaConfBaseException as exc:
        raise HarnessError(one_line(exc)) from None
    probe_output_parent(directory, key)
    probe_output_dir(cache_dir, "cache_dir")
    if tracking.enabled:
        check_store_is_mlflow(str(tracking.uri))


def _bad_override(overrides: list[str], exc: HydraException) -> str:
    """Name the override Hydra cannot parse: its own message names only the offending text."""
    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except HydraException as own:
            key = override.split("=", 1)[0]
            return (f"cannot parse the override {override!r} (key {key}): {one_line(own)}; "
                    "quote a value holding brackets, commas or spaces, e.g. 'key=\"a,b\"'")
    return one_line(exc)


def _missing_option(exc: MissingConfigException) -> str:
    text = str(exc)
    found = re.search(r"Could not find '([^']+)'", text)
    if found and "/" in found.group(1):
        group, option = found.group(1).rsplit("/", 1)
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        options = [o for o in options if not o.endswith("_schema")]
        allowed = ", ".join(options) if options else f"see conf/{group}/"
        return f"{group}={option} is not an option of group '{group}'; choose one of: {allowed}"
    return one_line(exc)


def one_line(exc: BaseException) -> str:
    """First line of an exception (and of its cause), plus the config key it names."""
    parts = []
    for e in (exc, exc.__cause__):
        if e is None:
            continue
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        if lines and lines[0] not in parts:
            parts.append(lines[0])
        key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), None)
        if key:
            parts.append(f"(key: {key})")
    return " ".join(parts) or type(exc).__name__
