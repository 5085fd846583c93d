"""`python -m harness --help`: every config group and option, and every top-level setting,
in one line each, read from conf/ and the model entries (an option's line is the first
sentence of its YAML's leading comment or of its model's description, a setting's the
comment above it or beside it in conf/config.yaml). The internal `*_schema` entries of
Hydra's ConfigStore are not options and are not listed; `--hydra-help` still shows Hydra's
own help.
"""

from __future__ import annotations

import re

from harness.cli.hints import CONF_DIR, group_options, groups
from harness.job.config import stored_options

GROUP_HELP = {
    "model": "the model: its published geometry (charged by the cost model) and weights",
    "budget": "GPU memory for experts: the paper's pinned settings or custom (budget.gpu_gb=...)",
    "system": "the expert-placement policy",
    "decode": "block-diffusion decoding settings",
    "workload": "the prompts decoded",
    "calibration": "prompts decoded once with gpu_only to learn routing statistics",
    "hardware": "the cost model's hardware profile",
    "topology": "one GPU with offloading, or several GPUs (expert parallelism)",
    "experiment": "a whole paper experiment, a sweep: python -m harness -m +experiment=<name>",
}
WIDTH = 30


def first_sentence(text: str, limit: int = 88) -> str:
    """The text up to its first full stop (or `limit` characters, cut at a word)."""
    sentence = re.split(r"(?<=\.)\s", text.strip(), maxsplit=1)[0].rstrip(".")
    return sentence if len(sentence) <= limit else sentence[: limit - 3].rsplit(" ", 1)[0] + "..."


def option_line(group: str, option: str) -> str:
    """The first sentence of the option's leading YAML comment (of its description, for an
    option registered in code: a model, harness/zoo)."""
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.exists():
        return first_sentence(stored_options()[group][option])
    comments = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text and not text.startswith("@package"):
            comments.append(text)
    return first_sentence(" ".join(comments)) if comments else ""


def settings_lines() -> list[tuple[str, str]]:
    """(key, description) for each top-level setting of conf/config.yaml and its sub-keys."""
    out: list[tuple[str, str]] = []
    comment: list[str] = []
    parent = ""
    body = (CONF_DIR / "config.yaml").read_text().split("\nhydra:", 1)[0].split("  - _self_", 1)[-1]
    for line in body.splitlines():
        if line.startswith("#"):
            comment.append(line.lstrip("#").strip())
            continue
        found = re.match(r"^( *)(\w+):\s*([^#]*?)\s*(?:#\s*(.*))?$", line)
        if not found:
            comment = []
            continue
        indent, key, value, beside = found.groups()
        name = f"{parent}.{key}" if indent else key
        if not indent:
            parent = key
        text = beside or " ".join(comment)
        if value or beside:  # a leaf (a mapping's own line carries only its comment block)
            out.append((f"{name}={value}" if value else name, first_sentence(text) if text else ""))
        elif not indent and text:
            out.append((f"{key}.*", first_sentence(text)))
        comment = []
    return out


def help_text() -> str:
    lines = ["usage: python -m harness [-m] [group=option ...] [key=value ...]", "",
             "One benchmark job (or, with -m, a sweep over comma-separated values: -m system=tide,fiddler).",
             "Every result goes to result.json in the run dir and to MLflow (docs/tracking.md).", "",
             "config groups (group=option; default in conf/config.yaml):"]
    for group in groups():
        lines.append(f"  {group + '=<option>':<{WIDTH}} {GROUP_HELP.get(group, '')}")
        lines += [f"    {option:<{WIDTH - 2}} {option_line(group, option)}" for option in group_options(group)]
    lines += ["", "settings (key=value, shown with the default; any field of a group too, e.g. budget.gpu_gb=12):"]
    lines += [f"  {key:<{WIDTH}} {text}" for key, text in settings_lines()]
    lines += ["", "flags:",
              f"  {'-m, --multirun':<{WIDTH}} run a sweep: every combination of the comma-separated values",
              f"  {'--cfg job':<{WIDTH}} print the composed config and exit",
              f"  {'--hydra-help':<{WIDTH}} Hydra's own help (launchers, sweepers, its flags)",
              f"  {'-h, --help':<{WIDTH}} this help", "",
              "other commands: harness-report, harness-analyze, harness-bench, harness-train, harness-track "
              "(each answers --help)", "python API: harness.run([...]), harness.sweep([...]), harness.report(...) "
              "(docs/python-api.md)"]
    return "\n".join(lines)
