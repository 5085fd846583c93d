"""`RunResult`: the typed record of one run, and the only reader and writer of result.json.

Sections: identity (what ran, where and on what), the resolved config, the budget, the
run's metrics (throughput, the engine's counters and modeled time, the workload's
counts), the system's own report, the lossless check (live runs), timing (modeled or
measured, with the wall-clock and measured figures), versions, the per-forward step
series, for live runs the decoded outputs and, when the run recorded a trace, its routing
statistics beside their uniform-routing values (harness/traces/routing_stats.py).

result.json keeps the flat layout its readers (report, tracking, resume, plots) and
older result files share: one `metrics` object holding every number of every section
(the system report's numbers too). A key that two sections both report is an error, not
a silent overwrite. `metric_sections` records which keys came from the lossless check
and from timing, so `from_json(save_json(r)) == r`; a file without it (older results,
hand-made ones) reads with all of its numbers as plain metrics.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.common.files import read_json, write_json_atomic
from harness.results.system_ids import RUN_COLOR_TAG, system_color, system_id
from harness.traces.routing_stats import routing_metrics

# MLflow shows these to one decimal (docs/tracking.md); result.json keeps them whole
ROUNDED_METRICS = ("tokens_per_s", "wall_tokens_per_s", "modeled_tokens_per_s")
SCHEMA = 9  # bumped when a field changes: docs/result-schema.md, harness/results/schema.py
PARAM_MAX_CHARS = 500  # MLflow allows 6000; long values (prompt lists) are in the config.yaml artifact
STEP_SERIES_KEYS = ("miss_rate", "modeled_latency_s")
OPTIONAL_IDENTITY = ("backend", "trace", "replay", "trace_derived_from", "calibration", "routing_source",
                     "hints")  # written only when set


# numbers in `metrics` that the config, the budget and the model fix before the run starts:
# MLflow gets them as params (one value, searchable), not as single-point metric charts
CONSTANT_METRICS = frozenset({
    "experts_per_layer", "experts_per_layer_derived", "budget_gb", "n_gpus", "capacity", "prompts",
    "steps_per_block", "c_io_s", "c_cu_s",
})


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class DuplicateMetricError(ValueError):
    """Two sections of a result report the same metric key."""


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class RunIdentity:
    """What ran, on what, and how: the result's top-level strings."""

    system: str | None = None
    model: str | None = None
    weights: str | None = None  # real | trained-proxy | random-proxy (older results: proxy)
    checkpoint: str | None = None
    source: str | None = None  # live | trace
    hardware: str | None = None  # the hardware profile charged
    decode_cache: str | None = None  # prefix | none
    backend: str | None = None  # live runs: cpu | cuda | standin
    trace: str | None = None  # replays: the trace file
    replay: str | None = None  # replays: how the trace was replayed
    trace_derived_from: str | None = None  # replays of a no-cache trace derived from a prefix-cached one
    calibration: str | None = None  # replays: the calibration trace the system learned from
    routing_source: str | None = None  # replays: where the trace's routing came from, if not this harness (imported)
    hints: str | None = None  # replays, hint-using systems: recorded | next_layer_loads | none (the stand-in)


@dataclass
class Timing:
    """How tokens_per_s was obtained (modeled | measured) and the clock figures beside it
    (wall and load seconds, replay speed, the device's measured figures)."""

    kind: str = "modeled"
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class DecodedOutputs:
    """A live run's tokens: per prompt, per forward, and the first prompt's text."""

    outputs: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    first_text: str = ""


@dataclass
class RunResult:
    identity: RunIdentity
    config: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    system_report: dict[str, Any] = field(default_factory=dict)
    lossless: dict[str, Any] = field(default_factory=dict)  # empty for replays (no numerics)
    timing: Timing = field(default_factory=Timing)
    versions: dict[str, str] = field(default_factory=dict)
    step_series: list[dict[str, Any]] = field(default_factory=list)
    decoded: DecodedOutputs | None = None
    workload: dict[str, Any] | None = None  # the prompts decoded (MLflow's dataset input)
    routing: dict[str, Any] | None = None  # routing statistics of the recorded trace, with their uniform values
    run_dir: Path | None = field(default=None, compare=False, repr=False)  # where it lies; not written
    started_at: float | None = None  # unix time (s) the job started; older results: None
    finished_at: float | None = None  # unix time (s) its result was complete
    # modeled time by component, per forward and per phase (harness/accounting/breakdown.py)
    cost_breakdown: dict[str, Any] | None = None
    # the hardware profile's constants whose source is an estimate, with that source (conf/hardware)
    hardware_estimates: dict[str, str] | None = None
    schema: int = SCHEMA

    # ------------------------------------------------------------------ the flat metrics

    def metric_sections(self) -> dict[str, dict[str, Any]]:
        report = {k: v for k, v in self.system_report.items() if is_number(v)}
        return {"metrics": self.metrics, "lossless": self.lossless, "timing": self.timing.figures,
                "system_report": report, "routing": routing_metrics_of(self.routing)}

    def flat_metrics(self) -> dict[str, Any]:
        """result.json's `metrics`: every section's numbers; a key in two sections is an error."""
        flat: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for section, values in self.metric_sections().items():
            for key, value in values.items():
                if key in flat:
                    raise DuplicateMetricError(
                        f"metric {key!r} is reported by both {origin[key]} and {section}; rename one of them")
                flat[key], origin[key] = value, section
        return flat

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """result.json's content."""
        ident = {f.name: getattr(self.identity, f.name) for f in fields(RunIdentity)}
        head = {k: v for k, v in ident.items() if k not in OPTIONAL_IDENTITY}
        out: dict[str, Any] = {"schema": self.schema, **head, "timing": self.timing.kind}
        out.update({k: ident[k] for k in OPTIONAL_IDENTITY if ident[k] is not None})
        out.update(budget=self.budget, config=self.config, metrics=self.flat_metrics(),
                   metric_sections={"lossless": list(self.lossless), "timing": list(self.timing.figures)},
                   step_series=self.step_series, system_report=self.system_report, versions=self.versions)
        if self.decoded is not None:
            out.update(outputs=self.decoded.outputs, steps=self.decoded.steps, first_text=self.decoded.first_text)
        if self.workload is not None:
            out["workload"] = self.workload
        if self.routing is not None:
            out["routing"] = self.routing
        if self.started_at is not None:
            out.update(started_at=self.started_at, finished_at=self.finished_at)
        if self.hardware_estimates is not None:
            out["hardware_estimates"] = self.hardware_estimates
        if self.cost_breakdown is not None:
            out["cost_breakdown"] = self.cost_breakdown
        return out

    def save_json(self, path: str | Path) -> Path:
        """Write result.json atomically (a reader never sees half a file)."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunResult:
        identity = RunIdentity(**{f.name: data.get(f.name) for f in fields(RunIdentity)})
        report = dict(data.get("system_report") or {})
        sections = data.get("metric_sections") or {}
        flat = dict(data.get("metrics") or {})
        lossless = {k: flat.pop(k) for k in sections.get("lossless", []) if k in flat}
        timing = {k: flat.pop(k) for k in sections.get("timing", []) if k in flat}
        for key, value in report.items():  # the report's numbers are copies in `metrics`
            if is_number(value) and flat.get(key) == value:
                flat.pop(key)
        routing = data.get("routing") if isinstance(data.get("routing"), Mapping) else None
        for key in routing_metrics_of(routing):  # copies of the routing section's numbers
            flat.pop(key, None)
        decoded = None
        if any(k in data for k in ("outputs", "steps", "first_text")):
            decoded = DecodedOutputs(list(data.get("outputs") or []), list(data.get("steps") or []),
                                     str(data.get("first_text") or ""))
        return cls(identity=identity, config=dict(data.get("config") or {}), budget=dict(data.get("budget") or {}),
                   metrics=flat, system_report=report, lossless=lossless,
                   timing=Timing(str(data.get("timing") or "modeled"), timing),
                   versions=dict(data.get("versions") or {}), step_series=list(data.get("step_series") or []),
                   decoded=decoded, workload=data.get("workload") if isinstance(data.get("workload"), dict) else None,
                   routing=dict(routing) if routing is not None else None,
                   started_at=_seconds(data.get("started_at")), finished_at=_seconds(data.get("finished_at")),
                   cost_breakdown=_mapping(data.get("cost_breakdown")),
                   hardware_estimates=_mapping(data.get("hardware_estimates")),
                   schema=int(data.get("schema", SCHEMA)))

    @classmethod
    def from_json(cls, path: str | Path) -> RunResult:
        data = read_json(path)
        if not isinstance(data, Mapping):
            raise ValueError(f"{path} holds no result object")
        result = cls.from_dict(data)
        result.run_dir = Path(path).parent
        return result

    def __getitem__(self, key: str) -> Any:
        """Read-only access by result.json key (e.g. result["metrics"]), for callers that
        compare results as JSON."""
        return self.to_dict()[key]

    # ------------------------------------------------------------------ what readers ask

    @property
    def budget_name(self) -> str | None:
        return self.budget.get("name") or (self.config.get("budget") or {}).get("name")

    @property
    def text(self) -> str | None:
        return self.decoded.first_text if self.decoded is not None else None

    def summary_lines(self, show_text: bool | None = None, show_wall: bool | None = None) -> list[str]:
        """The lines a finished run prints; the first prompt's text and the wall tokens/s beside
        a modeled figure only for real weights unless asked (None: by the weights)."""
        m, b, ident = self.flat_metrics(), self.budget, self.identity
        real = ident.weights == "real"
        show_text = real if show_text is None else show_text
        show_wall = (real or self.timing.kind != "modeled") if show_wall is None else show_wall
        tau = f" tau*={m['tau_star']:g}" if "tau_star" in m else ""
        lossless = (f"lossless={m['lossless']} (match {100 * m['token_match_rate']:.1f}%)" if "lossless" in m
                    else "lossless=n/a (replay: no numerics)")
        speed = f"{self.timing.kind} {m['tokens_per_s']:.1f} tokens/s"
        if m.get("measured_time_s"):  # how much of the measured time was the planner's and harness's Python
            share = (m["measured_host_plan_s"] + m["measured_host_engine_s"]) / m["measured_time_s"]
            speed += f" ({100 * share:.0f}% host planning)"
        if "modeled_tokens_per_s" in m:  # a measured run also reports the model's prediction
            speed += f", modeled {m['modeled_tokens_per_s']:.1f}"
        wall = show_wall and "wall_tokens_per_s" in m
        speed += f", wall {m['wall_tokens_per_s']:.1f}" if wall else f" ({ident.source})"
        overlap = (self.config.get("system") or {}).get("overlap")
        charging = "" if overlap is None else f" overlap={str(bool(overlap)).lower()}"
        charged = "; charged as itself, a smoke-test model: copies cost ~nothing, tokens/s does not rank systems" \
            if (self.config.get("model") or {}).get("nominal") == "proxy" else ""
        lines = [
            f"[{ident.system}] model={ident.model} ({ident.weights} weights{charged}{routing_note(ident)}) "
            f"budget={b['name']} "
            f"B={b['experts_per_layer']} cache={ident.decode_cache} hardware={ident.hardware}{charging}: "
            f"{m['prompts']} prompts, {m['generated_tokens']} tokens, {steps_text(m)} | "
            f"{speed} | miss {100 * m['miss_rate']:.1f}%, io {m['io_gb']:.2f} GB, cpu expert tokens "
            f"{m['cpu_expert_tokens']}{tau} | {lossless}"
        ]
        if show_text and self.decoded is not None:
            lines.append(f"first prompt's output: {self.decoded.first_text[:300]!r}")
        return lines

    # ------------------------------------------------------------------ MLflow

    def to_mlflow(self, run_dir: Path, config_hash: str | None, git_commit: str) -> MlflowRecord:
        """What tracking logs for this run: params (the config, and the numbers that the config
        and the model fix rather than the run measures: CONSTANT_METRICS), metrics, per-step
        series and tags."""
        numbers = {k: v for k, v in self.flat_metrics().items() if isinstance(v, int | float)}
        params = run_params(self.config)
        params.update({k: param_value(v) for k, v in numbers.items() if k in CONSTANT_METRICS and k not in params})
        metrics = {k: float(v) for k, v in numbers.items() if k not in CONSTANT_METRICS}
        for key in ROUNDED_METRICS:  # shown whole in the UI's columns (result.json keeps every digit)
            if key in metrics:
                metrics[key] = round(metrics[key], 1)
        if system_id(self.identity.system) is not None:  # parallel coordinates plot numbers, not names
            params["system_id"] = str(system_id(self.identity.system))
        return MlflowRecord(params=params, metrics=metrics, series=list(self.series_points()),
                            tags=self.mlflow_tags(run_dir, config_hash, git_commit))

    def series_points(self) -> Iterator[tuple[str, float, int]]:
        """(name, value, step): per-step series by global step, tau curves by tau."""
        for point in self.step_series:
            for key in STEP_SERIES_KEYS:
                if isinstance(point.get(key), int | float):
                    yield f"step_{key}", float(point[key]), int(point["global_step"])
        for name, curve in self.system_report.items():
            if not (isinstance(curve, list) and name.endswith("curve")):
                continue
            for i, item in enumerate(curve):
                if isinstance(item, int | float):
                    yield name, float(item), i + 1  # list index i is tau = i + 1
                elif isinstance(item, Mapping) and "tau" in item:
                    for key, value in item.items():
                        if key != "tau" and isinstance(value, int | float):
                            yield f"{name}.{key}", float(value), int(item["tau"])

    def mlflow_tags(self, run_dir: Path, config_hash: str | None, git_commit: str) -> dict[str, str]:
        ident, budget = self.identity, self.budget_name
        tags = {
            "harness.kind": "job",
            "system": ident.system, "model": ident.model, "weights": ident.weights,
            "timing": self.timing.kind, "hardware": ident.hardware,
            "decode_cache": ident.decode_cache, "budget": budget, "routing_source": ident.routing_source,
            "git_commit": git_commit, "mlflow.source.git.commit": git_commit,
            "machine": self.versions.get("machine") or platform.node(),
            "run_dir": str(run_dir.resolve()), "config_hash": config_hash,
            "mlflow.runName": "-".join(str(x) for x in (ident.system, budget, ident.model) if x),
            RUN_COLOR_TAG: system_color(ident.system),  # one colour per system in the chart view
        }
        return {k: str(v) for k, v in tags.items() if v is not None}


def _mapping(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def routing_metrics_of(routing: Mapping[str, Any] | None) -> dict[str, float]:
    """The flat routing_* metrics of a routing section (none without one)."""
    if not routing:
        return {}
    return routing_metrics(routing)


@dataclass
class MlflowRecord:
    params: dict[str, str]
    metrics: dict[str, float]
    series: list[tuple[str, float, int]]
    tags: dict[str, str]


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def param_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    if len(text) > PARAM_MAX_CHARS:
        return text[: PARAM_MAX_CHARS - 40] + f"... ({len(text)} chars, see config.yaml)"
    return text


def run_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The flattened resolved config; where it is logged is not part of what ran."""
    # hardware.sources: long citations, one per constant; they are in the config.yaml artifact
    return {k: param_value(v) for k, v in flatten(config).items()
            if not k.startswith(("tracking.", "hydra.", "hardware.sources."))}


def routing_note(ident: RunIdentity) -> str:
    """', imported routing, hints=none' for a replay of routing recorded elsewhere: the
    summary line says which routing the figures rest on and what a hint-using system got."""
    note = f", {ident.routing_source} routing" if ident.routing_source else ""
    return note + (f", hints={ident.hints}" if ident.hints and ident.hints != "recorded" else "")


def steps_text(m: dict[str, Any]) -> str:
    """The forwards that made the tokens: denoising steps, or an autoregressive run's decode
    steps with its (modeled) time to first token and per output token."""
    if m.get("decode_steps"):
        return (f"{m['decode_steps']} decode steps, ttft {1e3 * m['ttft_s']:.1f} ms, "
                f"tpot {1e3 * m['tpot_s']:.1f} ms")
    return f"{m['denoise_steps']} denoising steps"
