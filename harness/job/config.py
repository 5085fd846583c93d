"""The typed run config: `HarnessConfig` and the dataclasses of its parts.

The schemas are stored in Hydra's ConfigStore; `conf/config.yaml` pulls `base_config` in
first, and every system option file pulls its system's schema (`<name>_schema`), so every
YAML group is merged onto a typed node and a wrong type fails at compose time. The entry
point (harness/__main__.py, harness/cli/overrides.py) turns the composed config into a
`HarnessConfig` with `OmegaConf.to_object`; everything below it gets typed parts.

Value checks that a type cannot express (ranges, choices, pairings) run in the
dataclasses' `__post_init__` and raise one-line `HarnessError`s naming the key. A part
built by the schema itself holds `MISSING` ("???") in its mandatory fields; checks skip
those (`to_object` refuses a config that still has one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from harness.accounting.budget import BudgetConfig
from harness.accounting.cost import HardwareConfig
from harness.accounting.topology import TopologyConfig, build_topology, check_system_topology
from harness.common.checks import given, require
from harness.common.errors import HarnessError
from harness.decode.decoding import DecodeSettings
from harness.decode.workload import WorkloadConfig
from harness.hybrid.backend import check_backend
from harness.hybrid.repeats import TimingConfig
from harness.routing.params import RoutingConfig
from harness.traces.arrival_times import check_arrival_settings
from harness.tracking.settings import TrackingConfig
from harness.zoo.entry import ModelConfig, model_names, models_with, nominal_geometry
from harness.zoo.entry import entries as model_entries
from systems.registry import REGISTRY, SYSTEM_CONFIGS, system_from_config

SOURCES = ("live", "trace")


@dataclass
class CalibrationConfig:
    prompts: list[str] = field(default_factory=list)
    # > 0: calibrate on the last N prompts of the workload's own dataset (never ones the run
    # decodes) instead of `prompts`, so tau* and every learned placement see prompts of the
    # workload's length (docs/configuration.md)
    from_workload: int = 0

    def __post_init__(self) -> None:
        n = self.from_workload
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise HarnessError(f"calibration.from_workload={n!r} must be a whole number >= 0 (0: use "
                               "calibration.prompts)")


@dataclass
class ServedWorkloadConfig(WorkloadConfig):
    """The workload and when its requests arrive (harness/traces/arrival_times.py). The
    arrival settings live here, not in harness/decode/workload.py, because that file is part
    of the numerics fingerprint of every cached trace (harness/job/artifacts.py) and arrivals
    change no token or routing."""

    arrivals: str = "static"  # static | poisson | trace (replays only)
    arrival_rate: float | None = None  # poisson: requests per modeled second
    arrival_seed: int = 0  # poisson: the generator's seed
    arrival_trace: str | None = None  # trace: a JSON or CSV list of arrival times in seconds, one per request

    def __post_init__(self) -> None:
        super().__post_init__()
        check_arrival_settings(self.arrivals, self.arrival_rate, self.arrival_seed, self.arrival_trace)


@dataclass
class TraceConfig:
    path: str | None = None  # replay: a trace.npz; null = the cached trace of this model/workload/decode
    record: bool = False  # live: also save trace.npz (+ calibration.npz) into the run dir


@dataclass
class HarnessConfig:
    """One run's whole config. `system` is the chosen system's own config dataclass
    (systems/registry.py SYSTEM_CONFIGS); `block` is what conf/decode/*.yaml take
    decode.block_length and decode.steps from (`block=64`, sweeps `block=32,64`)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    block: int = 32
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    workload: ServedWorkloadConfig = field(default_factory=ServedWorkloadConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    system: Any = MISSING
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    cache_dir: str = "outputs/cache"
    limit_prompts: int | None = None
    # the first prompt's decoded text after the summary line; null: only for real weights (a proxy's
    # random weights decode noise)
    show_text: bool | None = None
    # this machine's wall tokens/s beside a modeled figure; null: not for proxies (it ranks this
    # CPU, not the modeled hardware; result.json and MLflow keep it either way)
    show_wall: bool | None = None
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    source: str = "live"  # live: decode with the model | trace: replay a routing trace (harness/job/replay.py)
    trace: TraceConfig = field(default_factory=TraceConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)  # generated routing (docs/routing-regimes.md)
    resume: bool = False  # skip jobs whose result exists for the same config hash (harness/job/resume.py)
    backend: str = "auto"  # auto | cpu | cuda | standin (harness/hybrid): where a live run executes its experts
    timing: TimingConfig = field(default_factory=TimingConfig)  # measured runs: warm-up and repeats
    # DALI's measures (busy shares, predictors, cache replays; harness/job/measures.py):
    # null = the transformers families only, true = every offloading run, false = none
    measures: bool | None = None

    def __post_init__(self) -> None:
        """The checks that span parts (each part checked its own values when it was built)."""
        w = self.workload
        require(
            w.path is not None or len(w.prompts) > 0 or w.dataset is not None,
            f"workload={w.name} has no prompts: set workload.path=<file.jsonl> "
            "(one JSON object with a 'prompt' per line) or list workload.prompts",
        )
        require(self.source in SOURCES, f"source={self.source!r} is not allowed; use live or trace")
        require(w.batch == 1 or self.source == "trace",
                f"workload.batch={w.batch} serves prompts in lock-step from a recorded trace, but a live run decodes "
                "one prompt at a time: add source=trace or drop workload.batch")
        require(w.arrivals == "static" or self.source == "trace",
                f"workload.arrivals={w.arrivals} serves the requests of a recorded trace as they arrive, but a live "
                "run decodes one prompt at a time: add source=trace or drop workload.arrivals")
        self._check_trace_options()
        require(
            self.limit_prompts is None or self.limit_prompts > 0,
            f"limit_prompts={self.limit_prompts} must be positive or null",
        )
        check_backend(self.backend)  # cuda without a GPU is a one-line error
        if given(self.model.name):
            self._check_model_capabilities()
        if given(self.system):  # ep_linear/gem only with topology=multi, and vice versa
            entry = REGISTRY[self.system.name]
            check_system_topology(entry.name, entry.multi_gpu, build_topology(self.topology))
            system_from_config(self.system)  # values its constructor refuses (system.tau=-3), now
        if given(self.model.name):
            self._check_lengths()

    def _check_model_capabilities(self) -> None:
        """What the run asks of the model against what its entry supports (harness/zoo)."""
        name, caps = self.model.name, self.model.entry.capabilities
        require(caps.live_decode or (self.source == "trace" and (self.trace.path is not None
                                                                 or self.routing.generated)),
                f"model={name} has no weights to decode: it replays imported routing traces only; use source=trace "
                "trace.path=<trace.npz>")
        require(caps.device_backend or self.backend not in ("cuda", "standin"),
                f"backend={self.backend} executes {models_with('device_backend')} only; model={name} runs with "
                "backend=cpu or auto (modeled timing)")
        require(caps.gen_length_bucket or not self.decode.gen_length_bucket,
                f"decode.gen_length_bucket={self.decode.gen_length_bucket} trims the decodes of "
                f"{models_with('gen_length_bucket')}, as their reference evaluation does; model={name} generates "
                "decode.gen_length tokens: drop it")

    def _check_trace_options(self) -> None:
        """trace.record belongs to a live run and trace.path to a replay: either one in the
        other kind of run would be ignored without a word."""
        require(not (self.source == "trace" and self.trace.record),
                 "trace.record=true records a live run's routing, but source=trace replays one; drop "
                 "trace.record or use source=live")
        require(self.source == "trace" or self.trace.path is None,
                 f"trace.path={self.trace.path!r} is read only by a replay (source=trace); a live run decodes "
                 "its own routing: add source=trace or drop trace.path")
        if self.routing.generated:
            require(self.source == "trace" and self.trace.path is None,
                    f"routing={self.routing.name} replays generated routing in place of a trace: use source=trace "
                    "without trace.path (or routing=recorded to replay the model's own)")
            require(self.routing.seed >= 0 and self.routing.calibration >= 0,
                    "routing.seed and routing.calibration must be whole numbers >= 0")
            self.routing.regime_file()  # bad knobs are one line now

    def _check_lengths(self) -> None:
        """decode lengths against the model's positions (the published, or the proxy's,
        geometry; a real checkpoint's own config.json and each prompt's token count are
        checked at load)."""
        d = self.decode
        limit = nominal_geometry(self.model).max_position_embeddings
        require(d.gen_length + 1 <= limit,
                 f"decode.gen_length={d.gen_length} does not fit model={self.model.name}'s {limit} positions "
                 f"(prompt + generated tokens); use at most {limit - 1}")
        require(d.block_length <= limit,
                 f"decode.block_length={d.block_length} exceeds model={self.model.name}'s {limit} positions")

    def as_dict(self) -> dict[str, Any]:
        """The resolved config as plain data: result.json's "config" and the resume hash."""
        return asdict(self)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=HarnessConfig)
    _register_system_schemas(cs)
    _register_models(cs)


def _register_models(cs: ConfigStore) -> None:
    """The `model` group's options are the entries' models (harness/zoo): one typed node
    each, and none left of an entry no longer registered (a test's throwaway family)."""
    group = cs.repo.setdefault("model", {})
    for stale in [key for key in group if key.removesuffix(".yaml") not in model_names()]:
        del group[stale]
    for entry in model_entries():
        for node in entry.models:
            cs.store(group="model", name=node.name, node=ModelConfig(name=node.name, nominal=node.nominal))


def stored_options() -> dict[str, dict[str, str]]:
    """The config groups whose options are nodes registered here rather than YAML files in
    conf/, each option with its description: the models (harness/zoo) and the systems
    (systems/registry.py)."""
    return {"model": {node.name: node.about for entry in model_entries() for node in entry.models},
            "system": {name: entry.description for name, entry in REGISTRY.items()}}


def _register_system_schemas(cs: ConfigStore) -> None:
    """The `system` group's options are the registered systems, each typed by its own
    dataclass at its defaults (`system=<name>`), and `<name>_schema` for a variant's YAML
    in conf/system (tide_sequential.yaml pulls `tide_schema` into its defaults); none is left
    of an entry no longer registered (a test's throwaway system)."""
    group = cs.repo.setdefault("system", {})
    for stale in [key for key in group if key.removesuffix(".yaml").removesuffix("_schema") not in SYSTEM_CONFIGS]:
        del group[stale]
    for name, node in SYSTEM_CONFIGS.items():
        cs.store(group="system", name=name, node=node)
        cs.store(group="system", name=f"{name}_schema", node=node)
