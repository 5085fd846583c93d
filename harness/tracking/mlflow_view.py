"""The experiment's saved view "Results": the MLflow UI's runs table with the results first.

MLflow 3.17's runs table shows Run Name, Created, Dataset, Duration, Source and Models by
default; every metric and param column is hidden until picked under Columns, and that
default is the UI's own (it cannot be set per experiment from a client). What 3.17 offers
instead are *saved views* (Views menu, top right of the runs page): an experiment tag
`mlflow.sharedViewState.<id>` holding {"name", "createdAt", "updatedAt", "state"}, where
`state` is the JSON of the page's search facets and UI state (selectedColumns as
`metrics.\\`tokens_per_s\\``, `params.\\`system.tau\\``, `attributes.\\`Dataset\\``, ...), read
from the experiment's tags when the page's URL carries `viewStateShareKey=<id>` (the
shape and keys were read from the 3.17 UI bundle, mlflow/server/js/build; checked in a
browser by scripts/ui_check.sh).

The harness writes one such view, "Results (harness)", into every experiment it logs to:
the system and budget params first, then tokens/s (logged to one decimal), miss rate, tau*,
lossless and I/O, then the model, `system_id` (a number per system, for parallel
coordinates) and every param a sweep into this experiment varied (each sweep adds its own),
and every link it prints opens the runs table in that view. A view someone saved over it in the UI (compressed by the
UI) is left as it is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

VIEW_ID = "harness-results"
VIEW_NAME = "Results (harness)"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_TAG = f"{VIEW_TAG_PREFIX}{VIEW_ID}"
VIEW_PARAM = f"viewStateShareKey={VIEW_ID}"
RESULT_METRICS = ("tokens_per_s", "miss_rate", "tau_star", "lossless", "io_gb")
BASE_PARAMS = ("system.name", "budget.name", "model.name", "system_id")
FIRST_PARAMS = ("system.name", "budget.name")  # left of the metrics; the rest right of them
CONFIG_GROUPS = ("model", "budget", "system", "decode", "hardware", "topology", "workload", "calibration")


def column(section: str, key: str) -> str:
    """The UI's column key: `metrics.\\`tokens_per_s\\``."""
    return f"{section}.`{key}`"


def view_state(params: Sequence[str]) -> dict[str, Any]:
    """The saved view's state: system and budget, then the result metrics (tokens/s, miss rate,
    tau*, lossless, I/O), then the other params (model, what sweeps varied, system_id), the
    Dataset column last."""
    params = list(dict.fromkeys(params))
    first = [p for p in FIRST_PARAMS if p in params]
    columns = [*(column("params", p) for p in first), *(column("metrics", m) for m in RESULT_METRICS),
               *(column("params", p) for p in params if p not in first), column("attributes", "Dataset")]
    return {"selectedColumns": columns}


def view_tag_value(params: Sequence[str], created_ms: int | None = None) -> str:
    """The experiment tag's value: the envelope the UI reads, its state as plain JSON."""
    now = int(time.time() * 1000)
    return json.dumps({"name": VIEW_NAME, "createdAt": created_ms or now, "updatedAt": now,
                       "state": json.dumps(view_state(params))})


def view_params(value: str | None) -> tuple[list[str], int | None] | None:
    """The params of a view the harness wrote, and when it was created; None for a view the UI
    wrote (compressed state) or no view."""
    try:
        envelope = json.loads(value or "")
        state = json.loads(envelope["state"])
        columns = state["selectedColumns"]
    except (ValueError, KeyError, TypeError):
        return None
    prefix = "params.`"
    params = [c[len(prefix):-1] for c in columns if isinstance(c, str) and c.startswith(prefix) and c.endswith("`")]
    return params, envelope.get("createdAt")


def swept_params(swept: Iterable[str]) -> list[str]:
    """The param names a sweep's overrides vary: `system=tide,fiddler` -> system.name (a
    config group's option is its `name`), `system.tau=1,2` -> system.tau, `block=32,64` -> block;
    Hydra's own keys and the experiment (not a param) are left out."""
    params = []
    for override in swept:
        key = override.split("=", 1)[0].lstrip("+~")
        if not key or key.startswith("hydra") or key == "experiment":
            continue
        params.append(f"{key}.name" if key in CONFIG_GROUPS else key)
    return list(dict.fromkeys(params))


def ensure_results_view(client: Any, experiment_id: str, params: Sequence[str] = ()) -> None:
    """Write (or extend with these params) the experiment's "Results (harness)" view."""
    experiment = client.get_experiment(experiment_id)
    current = (experiment.tags or {}).get(VIEW_TAG)
    parsed = view_params(current) if current is not None else ([], None)
    if parsed is None:
        return  # saved over in the UI: someone's choice
    known, created = parsed
    wanted = list(dict.fromkeys([*BASE_PARAMS, *known, *params]))
    if current is not None and wanted == known:
        return
    client.set_experiment_tag(experiment_id, VIEW_TAG, view_tag_value(wanted, created))
