"""A model entry: everything the harness knows about one kind of model, in one place (as
torchtitan's ModelSpec bundles a model); the registry of entries; and the `model` config
node, which names one model of one entry.

An entry holds
  models          the `model=<name>` options it serves, each with the nominal geometry it is
                  charged as and a line about it (Hydra's `model` group is built from them,
                  harness/job/config.py)
  geometry        its nominal geometry for a config node: a `MoEGeometry`, what the budget
                  and the cost model charge
  load            its weights: the checkpoint at model.path, else its proxy, built on first
                  use; None for a kind without weights (it replays imported traces only)
  proxy_identity  what its proxy's weights depend on (part of the key of the cached
                  reference tokens and traces, harness/job/artifacts.py)
  driver          its decode loop (one prompt), and `attach_engine`: how an engine serves
                  its MoE layers during a decode
  capabilities    what it supports; every check and default that differs between kinds
                  reads these, never the kind itself

The built-in entries are registered in harness/zoo/__init__.py; a test registers its own
with `registered(entry)` (docs/adding-a-model-family.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from omegaconf import MISSING
from torch import nn

from harness.common.checks import MAX_SEED, given, require
from harness.common.errors import HarnessError
from harness.decode.loading import AttachEngine, DecodeDriver, LoadedModel
from harness.model.experts import SUM_ORDERS
from harness.placement.system import MoEGeometry
from harness.training.proxy_cache import WEIGHT_KINDS

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Capabilities:
    """What a kind of model supports. A check or a default that differs between kinds reads
    one of these; a new kind states its own."""

    live_decode: bool = True  # it has weights (or a proxy) and a decode driver; false: it replays imported traces only
    device_backend: bool = False  # backend=cuda|standin executes it (the device executor serves its MoE layers)
    trained_proxy: bool = False  # model.weights=trained has a recipe for it (harness/training)
    expert_sum_order: bool = False  # model.expert_sum_order may be expert_id (its own code sums the experts)
    gen_length_bucket: bool = False  # decode.gen_length_bucket trims its decodes (as its reference evaluation does)
    paper_budgets: bool = False  # a budget pinned as the paper's setting (budget.paper=true) applies to it
    measures_by_default: bool = False  # measures=null computes DALI's measures for it (docs/dali-and-gem.md)


@dataclass(frozen=True)
class ModelNode:
    """One `model=<name>` option: the config node its entry stores in Hydra's `model` group."""

    name: str
    nominal: str  # the published geometry it is charged as (model.nominal)
    about: str  # what it is; python -m harness --help shows the first sentence


@dataclass
class LoadedWeights:
    """What an entry's `load` returns: the model, its tokenizer, what the weights are and
    where, and the two facts of the loaded model the decode loop reads."""

    model: nn.Module
    tokenizer: Any
    weights: str  # "real" | "trained-proxy" | "random-proxy"
    path: Path
    eos_ids: list[int]  # the token ids that end a generation
    max_positions: int  # the longest prompt + generation its positions cover


@dataclass(frozen=True)
class ModelEntry:
    name: str  # the entry: "llada2", or a transformers family's name
    label: str  # how messages name the kind ("LLaDA2", "Mixtral")
    models: tuple[ModelNode, ...]
    capabilities: Capabilities
    geometry: Callable[[ModelConfig], MoEGeometry]
    load: Callable[[ModelConfig, Path], LoadedWeights] | None = None
    proxy_identity: Callable[[ModelConfig, Path], dict[str, Any]] | None = None
    driver: DecodeDriver | None = None
    attach_engine: AttachEngine | None = None
    experiment_prefix: str = ""  # MLflow: one experiment per model, <prefix><model> (harness/tracking/run_files.py)

    def __post_init__(self) -> None:
        """A live-decoding kind has all four parts of a live run; a replay-only kind none."""
        parts = {"load": self.load, "proxy_identity": self.proxy_identity, "driver": self.driver,
                 "attach_engine": self.attach_engine}
        live = self.capabilities.live_decode
        wrong = [k for k, v in parts.items() if (v is None) == live]
        if wrong or not self.models:
            raise ValueError(f"model entry {self.name!r}: live_decode={live} but "
                             f"{', '.join(wrong) or 'no models'} {'missing' if live else 'set'}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.models)

    def check(self, cfg: ModelConfig) -> None:
        """The values of a `model` node that this kind does not support, each a one-line error."""
        caps = self.capabilities
        require(caps.trained_proxy or cfg.weights != "trained",
                f"model.weights=trained has no recipe for model={cfg.name}; its proxy is random (balanced "
                "routers): use model.weights=random or model.path=<checkpoint>")
        require(caps.expert_sum_order or cfg.expert_sum_order == "router",
                f"model.expert_sum_order={cfg.expert_sum_order} applies to {models_with('expert_sum_order')} "
                f"only; model={cfg.name} sums its experts as its own code does: leave it at router")

    def load_model(self, cfg: ModelConfig, cache_dir: str | Path) -> LoadedModel:
        """Its weights (model.path, else its proxy built on first use), ready to decode."""
        if self.load is None or self.driver is None or self.attach_engine is None:
            raise HarnessError(f"model={cfg.name} has no weights to decode ({self.label} replays imported routing "
                               "traces only): use source=trace trace.path=<trace.npz>")
        w = self.load(cfg, Path(cache_dir))
        return LoadedModel(w.model, w.tokenizer, w.weights, w.path, self.geometry(cfg), w.eos_ids,
                           w.max_positions, self.driver, self.attach_engine)


# ---- the registry --------------------------------------------------------------------------

_ENTRIES: dict[str, ModelEntry] = {}


def register(entry: ModelEntry) -> ModelEntry:
    """Add an entry; an entry or a model name taken twice is a programming error."""
    taken = set(model_names())
    if entry.name in _ENTRIES or taken & set(entry.names) or len(set(entry.names)) < len(entry.names):
        raise ValueError(f"model entry {entry.name!r} or one of its models {list(entry.names)} is registered already")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    _ENTRIES.pop(name, None)


@contextmanager
def registered(entry: ModelEntry) -> Iterator[ModelEntry]:
    """The entry registered for the duration (tests: a throwaway kind or family)."""
    register(entry)
    try:
        yield entry
    finally:
        unregister(entry.name)


def entries() -> list[ModelEntry]:
    """Every registered entry, in registration order."""
    return list(_ENTRIES.values())


def model_names() -> list[str]:
    """Every `model=` option, in the entries' order: the one list of model names."""
    return [name for entry in _ENTRIES.values() for name in entry.names]


def model_entry(name: str) -> ModelEntry:
    """The entry serving model `name`."""
    for entry in _ENTRIES.values():
        if name in entry.names:
            return entry
    raise HarnessError(f"model.name={name!r} is not allowed; use one of {', '.join(model_names())}")


def models_with(capability: str) -> str:
    """The models whose entry has `capability`, for messages: 'LLaDA2 (tiny, mini, flash)'."""
    if capability not in {f.name for f in fields(Capabilities)}:
        raise ValueError(f"no capability {capability!r}")
    having = [f"{e.label} ({', '.join(e.names)})" for e in _ENTRIES.values() if getattr(e.capabilities, capability)]
    return " and ".join(having) if having else "no model"


# ---- the `model` config node -------------------------------------------------------------


@dataclass
class ModelConfig:
    """The `model` config node: a model of one entry, its weights and dtype. Its options are
    the entries' models (`python -m harness --help`)."""

    name: str = MISSING  # a model of a registered entry (model_names())
    nominal: str = MISSING  # the published geometry it is charged as (llada2_mini, a family's name; tiny: proxy)
    path: str | None = None  # a real checkpoint directory; null -> its proxy
    dtype: str = "float32"  # float32 | bfloat16
    proxy_seed: int = 0
    weights: str = "random"  # proxies: trained (harness/training; entries that have a recipe) | random (seeded)
    # each token's routed outputs summed in the router's order (the reference's) or by ascending
    # expert id; both lossless (docs/model-and-decoding.md "Expert sum order"); entries that allow it
    expert_sum_order: str = "router"

    def __post_init__(self) -> None:
        entry = model_entry(self.name) if given(self.name) else None
        require(self.weights in WEIGHT_KINDS, f"model.weights={self.weights!r} is not allowed; use trained or random")
        require(self.dtype in DTYPES, f"model.dtype={self.dtype!r} is not allowed; use one of {', '.join(DTYPES)}")
        require(self.expert_sum_order in SUM_ORDERS, f"model.expert_sum_order={self.expert_sum_order!r} is not "
                f"allowed; use one of {', '.join(SUM_ORDERS)}")
        require(0 <= self.proxy_seed <= MAX_SEED, f"model.proxy_seed={self.proxy_seed} must be in [0, 2**63-1]")
        if entry is not None:
            entry.check(self)

    @property
    def entry(self) -> ModelEntry:
        return model_entry(self.name)


def nominal_geometry(cfg: ModelConfig) -> MoEGeometry:
    """The published geometry the model's runs are charged as (its entry's)."""
    return cfg.entry.geometry(cfg)


def load_model(cfg: ModelConfig, cache_dir: str | Path) -> LoadedModel:
    """The model of `cfg`, ready to decode: real weights from model.path, or its cached proxy
    (built on first use), as its entry loads it."""
    return cfg.entry.load_model(cfg, cache_dir)
