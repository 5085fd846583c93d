"""Records: one flat row per finished run (what identifies it, its headline metrics,
its step series), the one-line summary of a record, and the rules that shape a table of
records (the systems' order; harness/report/keys.py keys the rows). harness/report/tables.py builds the
tables and plots from them, harness/report/plots.py draws them, harness/job/resume.py and the sweep
callback print the line; a leaf below all three."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from harness.decode.workload import workload_record
from harness.results.run_result import RunResult, flatten
from harness.traces.arrival_times import ARRIVAL_DEFAULTS, hashed_workload
from systems.registry import REGISTRY, SYSTEM_CONFIGS

ROW_KEYS = ["model", "gen_length", "block_length", "budget"]

# config keys that say where a run kept things or how it printed, not what it measured; the
# row keys above (model.name, ...) and the resolved identity fields that replace a config key
# (weights for model.weights, backend for the configured one) are left out too
NOT_SETTINGS = ("tracking.", "hydra.", "system.", "workload.", "calibration.")
NOT_SETTING_KEYS = {"cache_dir", "show_text", "show_wall", "resume", "block", "backend", "trace.record",
                    "model.weights", "model.name", "decode.gen_length", "decode.block_length", "budget.name"}

# the registry's order, each system followed by its name when charged against its default overlap
SYSTEM_ORDER = [label for entry in REGISTRY.values() for label in entry.report_labels]

RECORD_METRICS = ["tokens_per_s", "wall_tokens_per_s", "miss_rate", "io_gb", "cpu_expert_tokens", "tau_star",
                  "lossless", "token_match_rate", "experts_per_layer", "generated_tokens", "requested_tokens",
                  "prompts", "ttft_s", "tpot_s"]

# DALI's measures (harness/job/measures.py): every metric that starts with one of these,
# for the run or one phase; a record keeps them apart (`measures`) for the report's section
MEASURE_PREFIXES = ("gpu_busy_share", "cpu_busy_share", "cpu_expert_share", "cpu_side_share", "expert_hit_rate",
                    "prefetch_precision_", "prefetch_recall_", "cache_hit_rate_")

SWEEP_FILES = ("sweep_summary.csv", "sweep_summary.md", "throughput.png")


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def system_label(name: str | None, system_config: Mapping[str, Any]) -> str | None:
    """The report's name for a system: its own, or `<name>_sequential` / `<name>_overlapped`
    when it was charged against its original's overlap (systems/registry.py defaults)."""
    overlap = system_config.get("overlap")
    if isinstance(overlap, str):  # an MLflow param
        overlap = {"true": True, "false": False}.get(overlap.strip().lower())
    if name is None or not isinstance(overlap, bool):
        return name
    default = getattr(SYSTEM_CONFIGS.get(name), "overlap", None)
    if default is None or overlap == default:
        return name
    return f"{name}_overlapped" if overlap else f"{name}_sequential"


def record_from_result(result: RunResult, source: str, status: str = "ok", order: float = 0.0
                       ) -> dict[str, Any]:
    """One flat row per result: what identifies the run, the headline metrics, the step series."""
    ident = result.identity
    decode, system = result.config.get("decode") or {}, result.config.get("system") or {}
    metrics = result.flat_metrics()
    tokens_per_s = metrics.get("tokens_per_s", metrics.get("wall_tokens_per_s"))
    record = {
        "source": source, "status": status, "order": order,
        "system": system_label(ident.system or system.get("name"), system), "model": ident.model,
        "experts": result.budget.get("experts_per_layer"),
        "gen_length": decode.get("gen_length"), "block_length": decode.get("block_length"),
        "budget": result.budget_name,
        "tau": _int(system.get("tau")), "migration": system.get("migration"),
        "timing": result.timing.kind if "tokens_per_s" in metrics else "wall",
        "decode_cache": ident.decode_cache or decode.get("cache"),
        "hardware": ident.hardware, "weights": ident.weights,
        "step_series": result.step_series,
        "routing": result.routing,
        "cost_breakdown": result.cost_breakdown,
        "trace": ident.trace,  # a replay's trace file (routing statistics in the report)
        "routing_source": ident.routing_source,  # imported routing (docs/real-routing.md); None: recorded here
        "tau_curve": result.system_report.get("lat_curve"),  # TIDE's objective over tau = 1..T
        "system_name": ident.system or system.get("name"),
        "settings": run_settings(result),
        "system_options": {k: setting_text(v) for k, v in flatten(system).items() if k not in ("name", "overlap")},
        "per_prompt": per_prompt(result),
        "measures": {k: float(v) for k, v in metrics.items()
                     if k.startswith(MEASURE_PREFIXES) and isinstance(v, int | float) and not isinstance(v, bool)},
        # every number of result.json's metrics, for the tidy frame (harness/report/frame.py)
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)},
    }
    record.update({k: _num(metrics.get(k)) for k in RECORD_METRICS})
    record["tokens_per_s"] = _num(tokens_per_s)
    return record


def setting_text(value: Any) -> str:
    """One canonical text per value, so a result.json's 32 and an MLflow param's "32" compare equal."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_settings(result: RunResult) -> dict[str, str]:
    """Every setting of a run besides its system and the fixed row keys: the flattened config
    (budget.gpu_gb, decode.threshold, hardware.name, ...), the workload by name and prompt digest,
    the calibration prompts by digest, and the resolved weights, timing and backend."""
    config = result.config
    measured = result.timing.kind == "measured"  # timing.warmup/repeats change nothing a model charges
    settings = {k: setting_text(v) for k, v in flatten(config).items()
                if not k.startswith(NOT_SETTINGS) and k not in NOT_SETTING_KEYS
                and (measured or not k.startswith("timing."))}
    workload = workload_of({"workload": result.workload, "config": config})
    if workload:
        settings["workload"] = f"{workload.get('name')} ({workload.get('digest')}, {workload.get('prompts')} prompts)"
    elif config.get("workload"):
        # (the arrival settings at their defaults left out: a static run is the row it was before they existed)
        hashed = hashed_workload(config["workload"] or {})
        settings["workload"] = f"{(config['workload'] or {}).get('name')} ({_digest(hashed)})"
    batch = (config.get("workload") or {}).get("batch")
    if batch is not None:  # lock-step serving: a batch of 16 and one of 64 are different settings
        settings["workload.batch"] = setting_text(batch)
    for key, default in ARRIVAL_DEFAULTS.items():  # serving with arrivals (docs/traces-and-experiments.md)
        value = (config.get("workload") or {}).get(key, default)
        if value != default:
            settings[f"workload.{key}"] = setting_text(value)
    calibration = config.get("calibration") or {}
    if calibration.get("prompts"):
        settings["calibration"] = _digest(calibration["prompts"])
    if calibration.get("from_workload"):  # the workload's own last N prompts instead of the listed ones
        settings["calibration"] = f"from_workload={calibration['from_workload']}"
    ident = result.identity
    settings.update(weights=setting_text(ident.weights), timing=result.timing.kind,
                    backend=setting_text(ident.backend or config.get("backend")))
    return settings


def per_prompt(result: RunResult) -> list[dict[str, float]]:
    """Each prompt's modeled tokens/s (its generated tokens over the modeled time of its
    forwards) and miss rate, from the step series and the decoded outputs; empty where the
    result has no per-prompt series (older results, replays without outputs)."""
    time_s: dict[int, float] = {}
    routed: dict[int, float] = {}
    missed: dict[int, float] = {}
    for point in result.step_series:
        if not isinstance(point.get("prompt"), int):
            return []
        p = point["prompt"]
        time_s[p] = time_s.get(p, 0.0) + float(point.get("modeled_latency_s") or 0.0)
        routed[p] = routed.get(p, 0.0) + float(point.get("routed_pairs") or 0.0)
        missed[p] = missed.get(p, 0.0) + float(point.get("missed_pairs") or 0.0)
    outputs = result.decoded.outputs if result.decoded is not None else []
    rows = []
    for p in sorted(time_s):
        row = {"prompt": float(p), "miss_rate": missed[p] / routed[p] if routed[p] else math.nan,
               "tokens_per_s": math.nan}
        if p < len(outputs) and time_s[p] > 0 and result.timing.kind == "modeled":
            row["tokens_per_s"] = float(outputs[p].get("n_generated", 0)) / time_s[p]
        rows.append(row)
    return rows


def compact_line(record: Mapping[str, Any], label: str = "") -> str:
    """One line per finished job of a sweep."""
    head = f"[{record['status']}] {label}: " if label else f"[{record['status']}] "
    tau = f" tau*={record['tau_star']:g}" if not math.isnan(record["tau_star"]) else ""
    return (f"{head}{record['system']} budget={record['budget']} model={record['model']} | "
            f"{record['tokens_per_s']:.1f} tok/s ({record['timing']}) | miss {_pct(record['miss_rate'])} | "
            f"io {record['io_gb']:.2f} GB{tau} | lossless={_yes_no(record['lossless'])}")


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _yes_no(x: float) -> str:
    return "-" if math.isnan(x) else ("yes" if x >= 1 else "no")


def _int(value: Any) -> Any:
    """'4' -> 4 (config values such as system.tau are strings: 'auto', 'random', '4')."""
    return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value


def system_order(systems: list[str]) -> list[str]:
    """The paper's order of systems; a column labelled with options (`tide (tau=4)`) follows its
    system's place, then the label's order."""

    def rank(label: str) -> tuple[int, str]:
        base = label.split(" (", 1)[0]
        return (SYSTEM_ORDER.index(base) if base in SYSTEM_ORDER else len(SYSTEM_ORDER), label)

    return sorted(dict.fromkeys(systems), key=rank)


def workload_of(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The result's workload record; for a result.json written before runs recorded one, the
    record of a built-in prompt list in its config (a prompts file may have changed since)."""
    if result.get("workload"):
        return dict(result["workload"])
    config = result.get("config") or {}
    workload = config.get("workload") or {}
    prompts = [str(p) for p in workload.get("prompts") or []]
    if workload.get("path") or not prompts or source_is_trace_file(config):
        return None
    return workload_record(workload, prompts[: config.get("limit_prompts") or None])


def source_is_trace_file(config: Mapping[str, Any]) -> bool:
    """A replay of an explicit trace decoded the trace's prompts, not the configured ones."""
    return config.get("source") == "trace" and bool((config.get("trace") or {}).get("path"))
