"""A number and a colour per system, for MLflow (docs/tracking.md "Comparing runs in the MLflow
UI"): `system_id` (a param; parallel coordinates plot numbers, not names) is the system's
place in systems/registry.py, and the run's colour in the chart view (`mlflow.runColor`, the
tag MLflow's UI reads a run's colour from; the constant is in the 3.17 UI bundle) is one of
ten distinct colours by that number, so that two systems never share one."""

from __future__ import annotations

from systems.registry import REGISTRY

RUN_COLOR_TAG = "mlflow.runColor"
# matplotlib's tab10, as the report's figures colour their systems
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def system_id(name: str | None) -> int | None:
    """The system's place in the registry (gpu_only 0, fiddler 1, ...); None for an unknown one."""
    return list(REGISTRY).index(name) if name in REGISTRY else None


def system_color(name: str | None) -> str | None:
    number = system_id(name)
    return None if number is None else PALETTE[number % len(PALETTE)]
