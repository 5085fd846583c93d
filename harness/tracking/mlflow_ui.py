"""How the harness's runs read in the MLflow UI: the experiment kind, the names and
markdown descriptions of sweep (parent) and job (child) runs, the workload as a dataset
input, and the link that opens an experiment on its runs table.

The experiment kind. MLflow 3 tags an experiment `mlflow.experimentKind`; the value
`custom_model_development` is the UI's "Machine learning" kind, whose experiment page is
the runs table (`genai_development` opens on the GenAI Overview: traces, latency). The
UI of MLflow 3.17 no longer reads that tag to pick the first page: a switch in its
sidebar ("GenAI" / "Model training", kept in the browser's localStorage, GenAI in a new
browser) or the URL parameter `workflowType=machine_learning` decides. So the harness
both tags its experiments and prints links that carry the parameter (`runs_page_link`);
scripts/ui_check.sh checks both in a real browser.

Nothing here imports MLflow at module level (tracking.enabled=false never pays for it).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from harness.tracking.mlflow_view import VIEW_PARAM

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # the UI's "Machine learning" kind: runs table first
NOTE_TAG = "mlflow.note.content"  # a run's description (markdown) on its page in the UI
DATASET_CONTEXT = "benchmark"  # the mlflow.data.context of the workload input
WORKFLOW_PARAM = "workflowType=machine_learning"
NOTE_MAX_CHARS = 8000  # MLflow's limit on a tag value
RUN_NAME_MAX_CHARS = 200


def experiment_tags() -> dict[str, str]:
    """Tags of every experiment the harness creates."""
    return {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}


def ui_base(uri: str, ui_url: str = "http://127.0.0.1:5000") -> str:
    """The UI that serves `uri`: a server URI is its own UI; a SQLite file needs `mlflow ui`,
    by default on 127.0.0.1:5000."""
    return (uri if uri.startswith(("http://", "https://")) else ui_url).rstrip("/")


def runs_page_link(uri: str, experiment_id: str, ui_url: str = "http://127.0.0.1:5000") -> str:
    """The URL of an experiment's runs table, in the harness's saved view "Results"
    (harness/tracking/mlflow_view.py: the result columns shown)."""
    return f"{ui_base(uri, ui_url)}/#/experiments/{experiment_id}/runs?{VIEW_PARAM}&{WORKFLOW_PARAM}"


def run_page_link(uri: str, experiment_id: str, run_id: str, ui_url: str = "http://127.0.0.1:5000") -> str:
    """The URL of one run's page."""
    return f"{ui_base(uri, ui_url)}/#/experiments/{experiment_id}/runs/{run_id}"


def ui_hint(uri: str, experiment_id: str) -> str:
    """One line telling where to compare a sweep's runs (in the saved view "Results")."""
    link = runs_page_link(uri, experiment_id)
    if uri.startswith(("http://", "https://")):
        return f"compare the runs in the MLflow UI: {link}"
    return f"compare the runs in the MLflow UI: mlflow ui --backend-store-uri {uri}, then open {link}"


# --------------------------------------------------------------------------- sweep (parent) runs


def swept_overrides(overrides: Sequence[str], sweeper_params: Mapping[str, Any] | None = None) -> list[str]:
    """What a sweep varies: the command line's sweep overrides (`system=a,b`), the sweeper's
    configured params (an experiment's grid) that the command line does not set, and
    the experiment it runs (`+experiment=table1`, first)."""
    parsed = _parse_overrides(overrides)
    experiments = [f"experiment={ov.value()}" for ov in parsed
                   if ov.get_key_element().lstrip("+~") == "experiment" and not ov.is_sweep_override()]
    swept = [ov.input_line.lstrip("+") for ov in parsed if ov.is_sweep_override()]
    named = {ov.get_key_element().lstrip("+~") for ov in parsed}  # the command line wins over the grid
    grid = [f"{k}={v}" for k, v in (sweeper_params or {}).items() if str(k).lstrip("+~") not in named]
    return experiments + swept + grid


def _parse_overrides(overrides: Sequence[str]) -> list[Any]:
    """Hydra's parse of each override; text that is not an override (a push's placeholder) is skipped."""

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed += parser.parse_overrides([text])
        except HydraException:
            continue
    return parsed


def parent_run_name(swept: Sequence[str], started: datetime, models: Iterable[str] = ()) -> str:
    """What the sweep varies first, then the model(s) unless swept, then when it started:
    `system=tide,fiddler × budget=10GB,18GB · mini · 2026-11-30 18:33` (the runs table cuts
    long names: the end is the part to lose)."""
    varies = " × ".join(swept) or "sweep"
    model_swept = any(o.split("=", 1)[0].lstrip("+~") in ("model", "model.name") for o in swept)
    parts = [varies, *([",".join(sorted(models))] if models and not model_swept else []), f"{started:%Y-%m-%d %H:%M}"]
    return _cut(" · ".join(parts))


def _cut(name: str) -> str:
    return name if len(name) <= RUN_NAME_MAX_CHARS else name[: RUN_NAME_MAX_CHARS - 3] + "..."


def child_run_name(system: Any, budget: Any, model: Any, swept: Mapping[str, str]) -> str:
    """`tide-10GB-mini system.tau=4 decode.threshold=0.9`: the job and every value its sweep
    varies that the first part does not already say."""
    head = "-".join(str(x) for x in (system, budget, model) if x)
    named = {"system", "system.name", "budget", "budget.name", "model", "model.name"}
    rest = " ".join(f"{k}={v}" for k, v in swept.items() if k not in named)
    return _cut(f"{head} {rest}" if rest else head)


def swept_keys(overrides: Sequence[str], sweeper_params: Mapping[str, Any] | None = None) -> list[str]:
    """The keys a sweep varies (without +/~), from its command line and its sweeper's grid."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in swept_overrides(overrides, sweeper_params)]
    return [k for k in keys if k != "experiment"]


def sweep_command(overrides: Sequence[str], hydra_overrides: Sequence[str] = ()) -> str:
    """The command line that runs this sweep (Hydra's own hydra.mode override left out)."""
    hydra = [o for o in hydra_overrides if not o.startswith("hydra.mode=")]
    return " ".join(["python -m harness -m", *(_shell_word(o) for o in [*overrides, *hydra])])


def _shell_word(text: str) -> str:
    """Quoted for a POSIX shell, readably: `block="'32','64'"` rather than shlex's '"'"' chains."""
    quoted = shlex.quote(text)
    if quoted == text or any(c in text for c in '"$`\\!'):
        return quoted
    return f'"{text}"'


def parent_description(command: str, summary_md: str | None = None, note: str | None = None) -> str:
    """The parent run's markdown description: the command, then the summary table (cut to
    MLflow's tag limit, whole rows at a time; the artifact sweep_summary.md is complete)."""
    head = f"**Sweep command**\n\n```\n{command}\n```\n"
    if note:
        head += f"\n{note}\n"
    if summary_md is None:
        return _cap(head + "\nThe summary table appears here when the sweep ends.\n")
    head += "\n**Summary** (modeled throughput unless `timing` says measured; children hold each job's run)\n\n"
    tail = ("\nArtifacts: `sweep_summary.md`, `sweep_summary.csv`, and under `plots/` every figure the report "
            "draws for this sweep (throughput, tau sweeps, miss rate per step; PNG, PDF and SVG). Compare the "
            "children in the Chart view (docs/tracking.md, *Comparing runs in the MLflow UI*).\n")
    lines = summary_md.rstrip("\n").split("\n")
    for keep in range(len(lines), 1, -1):
        cut = "" if keep == len(lines) else f"\n({len(lines) - keep} more rows in sweep_summary.md)\n"
        text = head + "\n".join(lines[:keep]) + "\n" + cut + tail
        if len(text) <= NOTE_MAX_CHARS:
            return text
    return _cap(head + tail)


def _cap(text: str) -> str:
    return text if len(text) <= NOTE_MAX_CHARS else text[: NOTE_MAX_CHARS - 4] + "\n..."


# --------------------------------------------------------------------------- job (child) runs


def child_description(result: Mapping[str, Any]) -> str:
    """One short markdown paragraph: what ran and the headline figures."""
    metrics = result.get("metrics") or {}
    budget = (result.get("budget") or {}).get("name") or "?"
    timing = result.get("timing") or "modeled"
    nominal = ((result.get("config") or {}).get("model") or {}).get("nominal")
    itself = (", charged as itself, a smoke-test model: its copies cost almost nothing, so tokens/s does not "
              "rank systems") if nominal == "proxy" else ""
    parts = [f"**{result.get('system')}** at budget {budget} on `{result.get('model')}` "
             f"({result.get('weights')} weights, {timing} timing on {result.get('hardware')}{itself})"]
    figures = []
    if isinstance(metrics.get("tokens_per_s"), int | float):
        figures.append(f"{metrics['tokens_per_s']:.1f} tokens/s ({timing})")
    if isinstance(metrics.get("miss_rate"), int | float):
        figures.append(f"miss rate {100 * metrics['miss_rate']:.1f}%")
    if "lossless" in metrics:
        figures.append("lossless" if metrics["lossless"] == 1 else "NOT lossless")
    workload = result.get("workload") or {}
    if workload:
        n = workload.get("prompts")
        figures.append(f"workload {workload.get('name')} ({n} prompt{'' if n == 1 else 's'})")
    return parts[0] + (": " + ", ".join(figures) if figures else "") + "."


# --------------------------------------------------------------------------- the workload as a dataset


def dataset_input(workload: Mapping[str, Any]) -> Any:
    """An MLflow DatasetInput for a result's `workload` record (harness.decode.workload.workload_record):
    the UI's Dataset column and dataset filter show it by name and digest."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    dataset = Dataset(
        name=str(workload["name"]), digest=str(workload["digest"]),
        source_type=str(workload["source_type"]), source=json.dumps(workload["source"]),
        schema=json.dumps({"mlflow_colspec": [{"type": "string", "name": "prompt", "required": True}]}),
        profile=json.dumps({"num_rows": int(workload["prompts"])}),
    )
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", DATASET_CONTEXT)])


def distinct_workloads(workloads: Sequence[Mapping[str, Any] | None]) -> list[Mapping[str, Any]]:
    """The different workloads among a sweep's jobs (by name and digest), in first-seen order."""
    seen: dict[tuple[str, str], Mapping[str, Any]] = {}
    for w in workloads:
        if w:
            seen.setdefault((str(w.get("name")), str(w.get("digest"))), w)
    return list(seen.values())
