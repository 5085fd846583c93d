"""systems/registry.py: one entry per system, carrying its policy, config dataclass, batch
planner and capabilities; the views and the code that asks them agree with the entries."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness.common.errors import HarnessError
from harness.placement.system import System
from systems.fiddler import Fiddler, FiddlerBatchPlanner
from systems.registry import REGISTRY, SYSTEM_CONFIGS, SYSTEMS, entry_of, make_system
from systems.tide import Tide, TideBatchPlanner


def test_each_entry_names_its_policy_and_config():
    assert list(SYSTEMS) == list(REGISTRY) == list(SYSTEM_CONFIGS)
    for name, entry in REGISTRY.items():
        assert entry.name == name == entry.policy.name
        assert issubclass(entry.policy, System) and dataclasses.is_dataclass(entry.config)
        assert entry.config().name == name  # a config's default name is its system's
        assert SYSTEMS[name] is entry.policy and SYSTEM_CONFIGS[name] is entry.config
        assert entry_of(make_system(name, {})) is entry


def test_capabilities():
    assert {n for n, e in REGISTRY.items() if e.multi_gpu} == {"ep_linear", "gem"}
    assert {n for n, e in REGISTRY.items() if e.batch_planner is not None} == {"fiddler", "static_split", "tide"}
    assert REGISTRY["fiddler"].batch_planner is FiddlerBatchPlanner
    assert REGISTRY["tide"].batch_planner is TideBatchPlanner
    calibrates = {n for n, e in REGISTRY.items() if e.needs_calibration(make_system(n, {}))}
    assert calibrates == {"fiddler", "static_split", "tide", "dali"}  # tide's default tau=auto solves tau* on one
    assert REGISTRY["gem"].needs_calibration(make_system("gem", {"window": "calibration"}))  # online by default
    assert not REGISTRY["tide"].needs_calibration(make_system("tide", {"tau": 4}))


def test_a_subclass_plans_layer_by_layer():
    class SlowTide(Tide):
        pass

    entry = REGISTRY["tide"]
    assert entry.plans_in_batch(Tide()) and not entry.plans_in_batch(SlowTide())
    with pytest.raises(ValueError, match="does not plan in batch"):
        entry.planner(SlowTide(), [set()], 4)
    planner = REGISTRY["fiddler"].planner(Fiddler(), [{0, 2}, {1}], 4)
    assert np.array_equal(planner.residency(), [[True, False, True, False], [False, True, False, False]])


def test_an_unknown_system_is_a_one_line_error():
    class Stranger(System):
        name = "stranger"

    with pytest.raises(HarnessError, match="unknown system 'stranger'"):
        entry_of(Stranger())
