"""The transformers families' checkpoints go through the checks LLaDA2's do
(harness/model/shards.py) before any decode: a NaN or Inf weight and a truncated shard are
one line naming the file or tensor, for every family; a checkpoint whose routing geometry
differs from the published one it is charged as is refused naming the field; a passed scan
is remembered per checkpoint identity (docs/bad-input.md)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.families import loading
from harness.families.loading import load_pretrained
from harness.model import shards
from harness.zoo.families import FamilyConfig, load
from tests import hostile_cases as cases
from tests.family_models import FAMILIES
from tests.hostile_cases import no_hang, refused  # noqa: F401 - no_hang: an autouse fixture


def family_of(directory: Path, name: str, tmp_path: Path) -> FamilyConfig:
    """A family entry's stored config whose published geometry is the saved checkpoint's own."""
    raw = {"adapter": name, "config": json.loads((directory / "config.json").read_text())}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return FamilyConfig(name, path)


def model_cfg(name: str, directory: Path) -> SimpleNamespace:
    return SimpleNamespace(name=name, nominal=name, path=str(directory), dtype="float32", proxy_seed=0)


@pytest.mark.parametrize("damage", list(cases.FAMILY_DAMAGE))
@pytest.mark.parametrize("name", FAMILIES)
def test_a_damaged_checkpoint_of_every_family_is_refused_before_decoding(name, damage, tmp_path, monkeypatch):
    directory = cases.saved_family(tmp_path / "ckpt", name)
    family = family_of(directory, name, tmp_path)
    edit, needle = cases.FAMILY_DAMAGE[damage]
    edit(directory)
    opened = []
    monkeypatch.setattr(loading.FamilyAdapter, "model_cls", lambda self: opened.append(1))
    refused(load, needle, family, model_cfg(name, directory), tmp_path / "cache")
    assert opened == []  # refused before transformers (let alone a decode) touched the weights
    assert not (tmp_path / "cache" / "finite").exists()


def test_the_family_scan_is_remembered_per_checkpoint_identity(tmp_path, monkeypatch):
    directory = cases.saved_family(tmp_path / "ckpt", "olmoe")
    load_pretrained(directory, finite_cache=tmp_path / "finite")
    assert len(list((tmp_path / "finite").glob("*.json"))) == 1
    calls = []
    scan = shards.first_non_finite
    monkeypatch.setattr(shards, "first_non_finite", lambda *a: calls.append(1) or scan(*a))
    load_pretrained(directory, finite_cache=tmp_path / "finite")
    assert calls == []
    cases.poison(directory, cases.first_weight(directory), "nan")
    refused(load_pretrained, "holds NaN or Inf", directory, finite_cache=tmp_path / "finite")
    assert calls == [1]


@pytest.mark.parametrize(("key", "value", "field"), [
    ("num_local_experts", 8, "num_experts=4"),
    ("num_experts_per_tok", 1, "num_experts_per_tok=1"),
    ("num_hidden_layers", 3, "sparse_layers=[0, 1]"),
])
def test_another_routing_geometry_than_the_published_one_names_the_field(key, value, field, tmp_path):
    directory = cases.saved_family(tmp_path / "ckpt", "mixtral")
    family = family_of(directory, "mixtral", tmp_path)
    raw = json.loads(family.path.read_text())
    raw["config"][key] = value
    family.path.write_text(json.dumps(raw))
    refused(load, field, FamilyConfig("mixtral", family.path), model_cfg("mixtral", directory), tmp_path / "cache")


def test_a_tensor_the_config_does_not_give_is_refused(tmp_path):
    directory = cases.saved_family(tmp_path / "ckpt", "olmoe")
    raw = json.loads((directory / "config.json").read_text())
    raw["intermediate_size"] = 24  # the stored experts are 16 wide
    (directory / "config.json").write_text(json.dumps(raw))
    refused(load_pretrained, "disagree with config.json", directory)


def test_the_published_mixtral_refuses_a_four_expert_checkpoint(tmp_path):
    from harness.families.geometry import CONFIG_DIR

    directory = cases.saved_family(tmp_path / "ckpt", "mixtral")
    refused(load, "num_experts=4 (experts per MoE layer) but model=mixtral",
            FamilyConfig("mixtral", CONFIG_DIR / "mixtral.json"), model_cfg("mixtral", directory), tmp_path / "cache")
