"""The tidy frame of finished runs (`harness.results(...)`, docs/python-api.md): one row per
run the report keeps (harness/report/keys.py: runs with the same settings are one, the
newer), flat columns, the frame the report's tables are pivoted from:

  run            the result's absolute path (or mlflow:<run id>)
  system         the report's column label (`tide (tau=4)`); system_name the bare system
  model, gen_length, block_length, budget, experts_per_layer (B)
  <setting>      every setting of the run (records.run_settings: decode.threshold, workload,
                 weights, timing, hardware.name, budget.gpu_gb, ...), as text
  system.<opt>   the system's options (system.tau, system.migration, ...), as text
  <metric>       every number of result.json's `metrics`, plus speedup over the row's best baseline

`frame.attrs["units"]` maps each metric column to its unit in the result schema
(docs/result-schema.md; speedup: x), `frame.attrs["keys"]` names the report's row keys (the
settings that differ) and `frame.attrs["warnings"]` holds the same-key warnings.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.report.keys import Keyed
from harness.results.schema import metric_entry

# the headline metrics first, then every other metric by name
FIRST = ["tokens_per_s", "speedup", "miss_rate", "io_gb", "tau_star", "lossless"]
IDENTITY = ["run", "system", "system_name", "model", "gen_length", "block_length", "budget", "experts_per_layer"]


def tidy_frame(keyed: Keyed, speedups: pd.Series) -> pd.DataFrame:
    """One row per kept run of `keyed`; `speedups` is with_speedups' column for its frame."""
    rows: list[dict[str, Any]] = []
    settings: set[str] = set()
    metrics: dict[str, None] = {}
    for (_, run), speedup in zip(keyed.frame.iterrows(), speedups, strict=True):
        row: dict[str, Any] = {"run": run["source"], "system": run["system"], "system_name": run["system_name"],
                               "model": run["model"], "gen_length": run["gen_length"],
                               "block_length": run["block_length"], "budget": run["budget"],
                               "experts_per_layer": run.get("experts")}
        options = run.get("system_options") or {}
        own = {**(run.get("settings") or {}), **{f"system.{k}": v for k, v in options.items()}}
        settings.update(own)
        numbers = {**(run.get("metrics") or {}), "tokens_per_s": run["tokens_per_s"], "speedup": speedup}
        metrics.update(dict.fromkeys(k for k in numbers if k not in IDENTITY))
        rows.append({**row, **own, **{k: v for k, v in numbers.items() if k not in IDENTITY}})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    ordered = [*FIRST, *sorted(m for m in metrics if m not in FIRST)]
    frame = frame[[*IDENTITY, *sorted(settings - set(IDENTITY)), *(m for m in ordered if m in metrics)]]
    frame.attrs["units"] = {c: unit for c in frame.columns if (unit := unit_of(c)) is not None}
    frame.attrs["keys"] = list(keyed.keys)
    frame.attrs["warnings"] = list(keyed.warnings)
    return frame


def unit_of(column: str) -> str | None:
    """A column's unit in the result schema (speedup: x); None for settings and names."""
    if column == "speedup":
        return "x"
    entry = metric_entry(column) if not column.startswith("system.") else None
    return entry[0] if entry else None
