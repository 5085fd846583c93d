"""harness/zoo: one entry per kind of model. The name lists, the Hydra `model` options and the
config checks come from the entries; kind-dependent behaviour reads their capabilities; a
kind without weights (a model known only by its config.json) is one more entry that replays
an imported trace and refuses a live run."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from harness.bench import synthetic_trace
from harness.cli.help import help_text
from harness.cli.hints import group_options
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.families.geometry import family_names
from harness.families.registry import nominal_geometry as family_nominal
from harness.job.config import register_configs, stored_options
from harness.job.live import run_job
from harness.job.setup import setup_run
from harness.model.config import LLaDA2Config
from harness.model.proxy import PROXY_SHAPES
from harness.placement.system import MoEGeometry
from harness.tracking.run_files import experiment_name
from harness.tracking.settings import TrackingConfig
from harness.zoo import ENTRIES
from harness.zoo.entry import (
    Capabilities,
    ModelConfig,
    ModelEntry,
    ModelNode,
    entries,
    load_model,
    model_names,
    nominal_geometry,
    registered,
)
from harness.zoo.families import FAMILIES
from harness.zoo.llada2 import LLADA2
from tests.conftest import REPO

register_configs()

# A kind known only by its config.json (the next kind of model): olmoe's published geometry,
# no weights, no driver; it replays imported routing traces only.
ROUTING_ONLY = ModelEntry(name="routing_only", label="Routing-only",
                          models=(ModelNode("routing_only", "olmoe", "A model known only by its config.json."),),
                          capabilities=Capabilities(live_decode=False), geometry=lambda cfg: family_nominal("olmoe"))


# ---- one list of names ----------------------------------------------------------------------


def test_the_model_names_are_the_entries_models_in_their_order() -> None:
    assert [e.name for e in entries()] == [e.name for e in ENTRIES] == ["llada2", *(f.name for f in FAMILIES)]
    assert model_names() == ["tiny", "mini", "flash", "diffusiongemma", "qwen3_moe", "mixtral", "olmoe"]
    assert LLADA2.names == tuple(PROXY_SHAPES)  # every LLaDA2 model has its proxy shape
    assert sorted(f.name for f in FAMILIES) == family_names()  # every stored family config has its entry


def test_the_hydra_model_options_are_the_entries_models() -> None:
    assert group_options("model") == sorted(model_names()) == sorted(stored_options()["model"])
    assert not (REPO / "conf" / "model").exists()  # no second list of options in YAML
    for entry in ENTRIES:
        for node in entry.models:
            cfg = compose_checked([f"model={node.name}"])
            assert (cfg.model.name, cfg.model.nominal, cfg.model.entry) == (node.name, node.nominal, entry)
    text = help_text()
    assert "    olmoe                        allenai/OLMoE-1B-7B (6.9B total, 1.3B active)" in text


def test_an_unknown_model_names_the_entries_models() -> None:
    with pytest.raises(HarnessError, match=r"model.name='huge' is not allowed; use one of tiny, mini, flash, "
                                           r"diffusiongemma, qwen3_moe, mixtral, olmoe"):
        ModelConfig(name="huge", nominal="proxy")
    with pytest.raises(HarnessError, match="model=llama is not an option of group 'model'; choose one of: "
                                           "diffusiongemma, flash, mini, mixtral, olmoe, qwen3_moe, tiny"):
        compose_checked(["model=llama"])


def test_a_name_taken_twice_and_an_entry_missing_a_live_part_are_programming_errors() -> None:
    taken = replace(ROUTING_ONLY, name="other", models=(ModelNode("olmoe", "olmoe", "x"),))
    with pytest.raises(ValueError, match="registered already"), registered(taken):
        pass
    with pytest.raises(ValueError, match="live_decode=True but load, proxy_identity, driver, attach_engine missing"):
        replace(ROUTING_ONLY, capabilities=Capabilities(live_decode=True))
    with pytest.raises(ValueError, match="live_decode=False but driver set"):
        replace(ROUTING_ONLY, driver=LLADA2.driver)
    assert "routing_only" not in model_names()


# ---- capabilities, not kinds ------------------------------------------------------------------


def test_every_geometry_is_a_moe_geometry() -> None:
    """Each entry's nominal geometry offers every member of the protocol the accounting types
    it by (harness/placement/system.py)."""
    members = [n for n in vars(MoEGeometry) if not n.startswith("_")]
    assert {"num_experts", "expert_bytes", "attention_params", "max_position_embeddings", "to_dict"} <= set(members)
    for name in model_names():
        geometry = nominal_geometry(compose_checked([f"model={name}"]).model)
        missing = [m for m in members if getattr(geometry, m, None) is None]
        assert not missing, (name, missing)
        assert isinstance(geometry.to_dict(), dict)
    assert isinstance(nominal_geometry(compose_checked(["model=flash"]).model), LLaDA2Config)


def test_capabilities_decide_what_differs_between_kinds() -> None:
    llada2 = LLADA2.capabilities
    assert (llada2.device_backend, llada2.trained_proxy, llada2.expert_sum_order, llada2.gen_length_bucket,
            llada2.paper_budgets, llada2.measures_by_default) == (True, True, True, True, True, False)
    for family in FAMILIES:
        assert family.capabilities == Capabilities(measures_by_default=True)
    # the paper's pinned B applies to the models whose entry takes the paper's budgets
    mini = setup_run(compose_checked(["model=mini", "budget=10GB"]), nominal_geometry(ModelConfig("mini",
                                                                                                  "llada2_mini")))
    assert mini.budget.pinned and mini.budget.experts_per_layer == 64
    cfg = compose_checked(["model=olmoe", "budget=10GB"])
    olmoe = setup_run(cfg, nominal_geometry(cfg.model))
    assert not olmoe.budget.pinned and olmoe.budget.experts_per_layer == olmoe.budget.derived_experts_per_layer


def test_mlflow_experiments_are_named_by_the_entries() -> None:
    tracking = TrackingConfig()
    assert experiment_name(tracking, ["mini"]) == "llada2-mini"
    assert experiment_name(tracking, ["olmoe"]) == "olmoe"
    assert experiment_name(tracking, ["tiny", "mini"]) == "llada2-sweeps"
    assert experiment_name(tracking, ["mini", "olmoe"]) == "moe-sweeps"
    assert experiment_name(tracking, ["olmoe", "mixtral"]) == "moe-sweeps"
    assert experiment_name(tracking, ["gone"]) == "gone"  # a result of a model no longer registered
    assert experiment_name(replace(tracking, experiment="mine"), ["mini"]) == "mine"


def test_no_kind_test_outside_the_entries() -> None:
    """Which kind a model is, is asked only inside harness/zoo: elsewhere the code reads an
    entry's capabilities, driver or geometry (a step's or a timing's kind is another thing)."""
    model_kind = re.compile(r"is_family|(?:model|loaded|adapter|geometry|entry|cfg)\.kind\s*[!=]=|ModelKind")
    found = [f"{path.relative_to(REPO)}:{i}" for path in sorted((REPO / "harness").rglob("*.py"))
             if "zoo" not in path.relative_to(REPO).parts
             for i, line in enumerate(path.read_text().splitlines(), 1) if model_kind.search(line)]
    assert not found, found


# ---- the next kind: a model known only by its config.json ----------------------------------


def test_a_replay_only_kind_is_one_entry_that_refuses_a_live_run(tmp_path: Path) -> None:
    with registered(ROUTING_ONLY):
        assert "routing_only" in group_options("model")
        with pytest.raises(HarnessError, match=r"model=routing_only has no weights to decode: it replays imported "
                                               r"routing traces only; use source=trace trace\.path=<trace\.npz>"):
            compose_checked(["model=routing_only"])
        with pytest.raises(HarnessError, match="has no weights to decode"):
            load_model(ModelConfig("routing_only", "olmoe"), tmp_path)
        trace = synthetic_trace(family_nominal("olmoe"), steps=6, tokens=2)
        trace.meta.update(prompts=1, generated_tokens=6, denoise_steps=6)
        trace.save(tmp_path / "trace.npz")
        cfg = compose_checked(["model=routing_only", "source=trace", f"trace.path={tmp_path / 'trace.npz'}",
                               "system=mixtral_offload", "budget=custom", "budget.experts_per_layer=8",
                               "tracking.enabled=false", f"cache_dir={tmp_path}"])
        result = run_job(cfg, tmp_path / "run")
        m = result.flat_metrics()
        assert result.identity.model == "routing_only" and result.identity.source == "trace"
        assert m["routed_pairs"] == 6 * 16 * 2 * 8 and m["missed_pairs"] > 0 and m["modeled_time_s"] > 0
    assert "routing_only" not in group_options("model")
    with pytest.raises(HarnessError, match="routing_only is not an option"):
        compose_checked(["model=routing_only"])
