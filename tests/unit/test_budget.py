"""Budget -> B: the docs/cost-model.md formula, the paper's pinned settings, and the errors."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.accounting.budget import BudgetConfig, resolve_budget
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.model.config import LLaDA2Config
from tests.conftest import REPO

CONF = REPO / "conf" / "budget"
MINI = LLaDA2Config.published("llada2_mini")
FLASH = LLaDA2Config.published("llada2_flash")
register_configs()


def _yaml(name: str, **overrides: object) -> BudgetConfig:
    cfg = OmegaConf.merge(OmegaConf.structured(BudgetConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize(
    ("geometry", "gb", "expected"),
    [
        (MINI, 10, 63),
        (MINI, 18, 130),
        (FLASH, 30, 30),
        (FLASH, 55, 62),
    ],
)
def test_derived_experts_per_layer_follow_the_formula(
    geometry: LLaDA2Config, gb: float, expected: int
) -> None:
    budget = resolve_budget(BudgetConfig(name="x", gpu_gb=gb), geometry)
    formula = math.floor(
        (gb * 1e9 - geometry.non_expert_bytes() - 0.5e9) / (geometry.n_moe_layers * geometry.expert_bytes())
    )
    assert budget.derived_experts_per_layer == formula == expected
    assert budget.experts_per_layer == expected and not budget.pinned
    assert not budget.over_budget and not budget.fits_model


@pytest.mark.parametrize(
    ("name", "geometry", "pinned", "derived"),
    [
        ("10GB", MINI, 64, 63),
        ("18GB", MINI, 128, 130),
        ("30GB", FLASH, 32, 30),
        ("55GB", FLASH, 64, 62),
    ],
)
def test_paper_budgets_pin_b_and_log_the_derived_one(
    name: str, geometry: LLaDA2Config, pinned: int, derived: int
) -> None:
    budget = resolve_budget(_yaml(name), geometry)
    assert (budget.experts_per_layer, budget.derived_experts_per_layer, budget.pinned) == (
        pinned,
        derived,
        True,
    )
    assert budget.name == name
    assert budget.over_budget == (pinned > derived)


def test_custom_budget_derives_b_and_takes_overrides() -> None:
    base = resolve_budget(_yaml("custom"), MINI)
    bigger = resolve_budget(_yaml("custom", gpu_gb=13), MINI)
    assert not base.pinned and base.gpu_gb == 12
    assert bigger.gpu_gb == 13 and bigger.experts_per_layer > base.experts_per_layer


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_budget_yaml_keys_match_the_schema(path: Path) -> None:
    assert set(OmegaConf.load(path).keys()) == {f.name for f in fields(BudgetConfig)}


def test_b_is_capped_at_the_expert_count_and_the_configured_maximum() -> None:
    roomy = resolve_budget(BudgetConfig(gpu_gb=40), MINI)
    assert roomy.experts_per_layer == MINI.num_experts and roomy.fits_model
    capped = resolve_budget(BudgetConfig(gpu_gb=40, max_experts_per_layer=100), MINI)
    assert capped.experts_per_layer == 100


@pytest.mark.parametrize(
    ("values", "geometry", "key"),
    [
        ({"gpu_gb": 6}, FLASH, "budget.gpu_gb"),  # below flash's 6.06 GB of non-expert weights
        ({"gpu_gb": 2.2}, MINI, "budget.reserve_gb"),  # non-expert fits, the reserve does not
        ({"gpu_gb": 10, "experts_per_layer": 300}, MINI, "budget.experts_per_layer"),
        ({"gpu_gb": 0}, MINI, "budget.gpu_gb"),
        ({"gpu_gb": -3}, MINI, "budget.gpu_gb"),
        ({"gpu_gb": 10, "experts_per_layer": 0}, MINI, "budget.experts_per_layer"),
        ({"gpu_gb": 10, "reserve_gb": -0.1}, MINI, "budget.reserve_gb"),
        ({"gpu_gb": 10, "max_experts_per_layer": 0}, MINI, "budget.max_experts_per_layer"),
        ({"gpu_gb": 10, "experts_per_layer": 64, "max_experts_per_layer": 32}, MINI, "budget.max_experts_per_layer"),
    ],
)
def test_bad_budgets_are_one_line_errors_naming_the_key(
    values: dict, geometry: LLaDA2Config, key: str
) -> None:
    with pytest.raises(HarnessError) as err:  # values are checked when the config is built, B per model
        resolve_budget(BudgetConfig(**values), geometry)
    message = str(err.value)
    assert key in message and "\n" not in message


def test_unknown_budget_keys_are_rejected() -> None:
    with pytest.raises(HarnessError, match="gpu_gib"):
        compose_checked(["budget.gpu_gib=10"])
