"""The families the bridge serves: one adapter each, found by family name (the name of
harness/families/configs/<name>.json) or by a checkpoint's HF model_type.

Mixtral, Qwen3-MoE and OLMoE differ from the generic decoder-only adapter only in data
(key names, the QK norm); DiffusionGemma has its own adapter (diffusiongemma.py).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from harness.common.errors import HarnessError
from harness.families.adapter import FamilyAdapter
from harness.families.diffusiongemma import DIFFUSIONGEMMA
from harness.families.geometry import FamilyGeometry, family_names, read_family_json

QWEN3_MOE = FamilyAdapter(name="qwen3_moe", model_types=("qwen3_moe",), qk_norm="head")
MIXTRAL = FamilyAdapter(name="mixtral", model_types=("mixtral",), expert_width_key="intermediate_size")
OLMOE = FamilyAdapter(name="olmoe", model_types=("olmoe",), qk_norm="full", expert_width_key="intermediate_size")

ADAPTERS: dict[str, FamilyAdapter] = {a.name: a for a in (QWEN3_MOE, MIXTRAL, OLMOE, DIFFUSIONGEMMA)}


def adapter(name: str) -> FamilyAdapter:
    if name not in ADAPTERS:
        raise HarnessError(f"no family adapter {name!r}; the adapters are {', '.join(sorted(ADAPTERS))} "
                           "(docs/adding-a-model-family.md adds one)")
    return ADAPTERS[name]


def served_model_types() -> list[str]:
    return sorted(t for a in ADAPTERS.values() for t in a.model_types)


def adapter_for_model_type(model_type: object) -> FamilyAdapter:
    for a in ADAPTERS.values():
        if model_type in a.model_types:
            return a
    raise HarnessError(
        f"config.json has model_type={model_type!r}, which the harness has no family adapter for (the bridge "
        f"serves MoE models whose experts use transformers' experts interface); allowed: "
        f"{', '.join(served_model_types())} (docs/adding-a-model-family.md adds one)"
    )


def family_adapter(name: str, family_json: dict[str, Any] | None = None) -> FamilyAdapter:
    """The adapter a family's config names (`family_json`: its stored config, read from
    harness/families/configs/<name>.json when not given)."""
    return adapter((family_json if family_json is not None else read_family_json(name))["adapter"])


def geometry_of(model) -> FamilyGeometry:
    """The geometry of a built model, from its own config (a proxy's widths included)."""
    adapter = adapter_for_model_type(getattr(model.config, "model_type", None))
    return adapter.geometry(adapter.name, model.config.to_dict())


@cache
def nominal_geometry(name: str) -> FamilyGeometry:
    """The published geometry the budget and the cost model charge for family `name` (its
    config in harness/families/configs)."""
    return family_geometry(name, read_family_json(name))


def family_geometry(name: str, family_json: dict[str, Any]) -> FamilyGeometry:
    """The published geometry of a family from its stored config (`_source`, `adapter`,
    `config`, `proxy`; docs/adding-a-model-family.md)."""
    return family_adapter(name, family_json).geometry(name, family_json["config"])


__all__ = ["ADAPTERS", "adapter", "adapter_for_model_type", "family_adapter", "family_geometry", "family_names",
           "geometry_of", "nominal_geometry"]
