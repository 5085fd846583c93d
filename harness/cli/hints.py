"""The command line's common mistakes, each answered by one line that names the fix
(harness/cli/overrides.py calls these before anything is composed or run):

  system=tide_schema      an internal schema (Hydra's ConfigStore), refused as a value
  system=tdie             not an option: "did you mean tide?" (also for keys: sytem=, decode.gen_lenght=)
  budget=12GB             not an option: use budget=custom budget.gpu_gb=12
  experiment=table1       a group outside the defaults: write +experiment=table1
  system=tide,fiddler     a sweep without -m: add -m, or quote one value that holds a comma
  tracking=false          a node of settings given one value: set one of its fields (tracking.enabled=false)
  decode=8                a group given a number: its options, or one of its fields
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from harness.common.errors import HarnessError
from harness.common.keyvalue import did_you_mean
from harness.job.config import stored_options

CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"
MULTIRUN_FLAGS = ("-m", "--multirun", "hydra.mode=MULTIRUN")
OUTSIDE_DEFAULTS = ("experiment",)  # groups that are added (+group=option), not overridden


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The options of a config group: its YAML files, or the nodes registered in code (the
    models, from their entries: harness/job/config.py); the *_schema entries are not options."""
    return sorted({p.stem for p in (conf_dir / group).glob("*.yaml")} | set(stored_options().get(group, {})))


def groups() -> list[str]:
    return sorted({p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra"} | set(stored_options()))


def _parsed(overrides: Sequence[str]) -> list:
    parsed = []
    for text in overrides:
        try:
            parsed += OverridesParser.create().parse_overrides([text])
        except HydraException:
            continue  # cli_check reports an override it cannot parse
    return parsed


def refuse_schema_options(overrides: Sequence[str]) -> None:
    """`system=tide_schema` names a structured schema, not an option: refused."""
    for ov in _parsed(overrides):
        group = ov.get_key_element().lstrip("+~")
        if group not in groups():
            continue
        values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [str(ov.value())]
        for value in values:
            if value.endswith("_schema"):
                raise HarnessError(f"{group}={value} is an internal schema, not an option of group '{group}'; "
                                   f"choose one of: {', '.join(group_options(group))}")


def refuse_sweep_without_multirun(argv: Sequence[str], overrides: Sequence[str]) -> None:
    """A comma makes a sweep, which only `-m` runs (Hydra's own answer is four lines and exit 1)."""
    if any(a in MULTIRUN_FLAGS for a in argv):
        return
    sweeps = [ov.input_line for ov in _parsed(overrides) if ov.is_sweep_override()]
    if sweeps:
        raise HarnessError(f"{sweeps[0]} lists several values, a sweep: add -m (python -m harness -m "
                           f"{' '.join(overrides)}); to pass one value that holds a comma, quote it: "
                           f"'{sweeps[0].split('=', 1)[0]}=\"a,b\"'")


def with_hint(message: str, overrides: Sequence[str], keys_under: Callable[[str], list[str]]) -> str:
    """A composition error with the fix it calls for: a budget size, a + for experiment, a
    close name for a misspelled option or key (`keys_under(parent)`: the config's keys there)."""
    found = re.match(r"(\S+?)=(\S+) is not an option of group '([^']+)'", message)
    if found:
        option, group = found.group(2), found.group(3)
        same = [o for o in group_options(group) if o.lower() == option.lower()]
        if same:  # budget=10gb: the option written in other letters
            return f"{message}; did you mean {same[0]}? (options are case-sensitive)"
        size = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:GB|G|gb|g)?", option)
        if group == "budget" and size:
            return f"{message}; for {size.group(1)} GB use budget=custom budget.gpu_gb={size.group(1)}"
        return message + did_you_mean(option, group_options(group))
    found = re.match(r"Could not override '([^']+)'\. No match in the defaults list", message)
    if found and found.group(1) in OUTSIDE_DEFAULTS:
        key = found.group(1)
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key), "<name>")
        return (f"{key}={value}: '{key}' is not in the defaults list, so it is added, not overridden: "
                f"write +{key}={value} (a whole experiment is a sweep: python -m harness -m +{key}={value})")
    found = re.search(r"is not a subclass of \w+\. value: (.*) \(key: ([^)]+)\)", message)
    if found:  # a value given to a node of settings (tracking=false)
        value, key = found.group(1), found.group(2)
        fields = keys_under(key)
        example = f"{key}.{fields[0]}={value.lower() if value in ('True', 'False') else value}" if fields else key
        return f"{message}; '{key}' holds settings ({', '.join(fields)}), not one value: set one, e.g. {example}"
    if message.startswith("Config group override must be a string"):  # decode=8: a group given a number
        group = next((o.split("=", 1)[0].lstrip("+~") for o in overrides
                      if o.split("=", 1)[0].lstrip("+~") in groups() and not re.search(r"=[A-Za-z_]", o)), None)
        if group:
            return (f"{message}; '{group}' is a config group: choose one of its options "
                    f"({', '.join(group_options(group))}) or set a field, e.g. {group}.<field>=<value>")
    found = re.search(r"Key '([^']+)' not in '([^']+)' \(key: ([^)]+)\)", message)
    if found:
        key, full = found.group(1), found.group(3)
        parent = full.rsplit(".", 1)[0] if "." in full else ""
        return message + did_you_mean(key, keys_under(parent))
    return message


def config_keys(config: Any, parent: str) -> list[str]:
    """The keys under a node of a composed config ('' for the top level, with the groups)."""
    node = config
    for part in [p for p in parent.split(".") if p]:
        node = node.get(part) if hasattr(node, "get") else None
    keys = list(node.keys()) if hasattr(node, "keys") else []
    return [str(k) for k in keys] + (groups() if not parent else [])
