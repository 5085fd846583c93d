"""Mixtral-Offload's pipelined misses (harness/accounting/pipeline.py): the time rule on hand-made
layers, through the ledger, and the option on the system."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.accounting.ledger import LayerOutcomes, Ledger
from harness.accounting.pipeline import pipelined_layer
from harness.common.errors import HarnessError
from harness.engine.engine import OffloadEngine
from harness.model.config import LLaDA2Config
from harness.placement.steps import StepInfo
from systems.registry import make_system

GEO = LLaDA2Config(num_hidden_layers=2, num_experts=8, n_group=1, topk_group=1, num_experts_per_tok=4)
COST = CostModel(GEO, HardwareConfig(pcie_gbps=1.0))


@pytest.mark.parametrize(("slots", "end", "link"), [(1, 13.0, 11.0), (2, 11.0, 9.0), (3, 11.0, 9.0)])
def test_the_time_rule_on_a_hand_made_layer(slots: int, end: float, link: float) -> None:
    # hits 5 s, three misses of 2 s each, a copy takes 3 s. One slot: copy 1 waits until
    # miss 0 starts at 5 (ends 8), miss 1 starts at 8, copy 2 starts at 8 (ends 11), miss 2
    # runs 11..13. Two or more: copies end at 3, 6, 9 and the misses run 5..7, 7..9, 9..11.
    assert pipelined_layer(0.0, 0.0, 5.0, np.array([2.0, 2.0, 2.0]), 3, 3.0, slots) == (end, link)


def test_a_layer_without_misses_is_its_hits_and_the_link_stays_where_it_was() -> None:
    assert pipelined_layer(1.0, 4.0, 5.0, np.zeros(2), 0, 3.0, 1) == (6.0, 4.0)


def test_a_busy_link_delays_the_first_copy() -> None:
    # the link is free at 7: copies end 10 and 13; misses run 10..12, 13..15 after hits 0..5
    assert pipelined_layer(0.0, 7.0, 5.0, np.array([2.0, 2.0]), 2, 3.0, 3) == (15.0, 13.0)


def _charged_copies(slots: int) -> float:
    """Exposed copy seconds of one hand-made layer: experts 0, 1 resident and routed, 3 and
    7 missed and copied (sync), everything on the GPU."""
    ledger = Ledger(COST, GEO.n_moe_layers, 8, overlap=False, pipeline_slots=slots)
    loads = np.array([[[3, 1, 0, 2, 0, 0, 0, 1]]])
    on_gpu = loads > 0
    missed = np.zeros_like(on_gpu)
    missed[0, 0, [3, 7]] = True
    two, zero = np.array([[2]]), np.array([[0]])
    ledger.charge([StepInfo(0, 0, 0, 0, True)], [(4, 4)], LayerOutcomes(loads, on_gpu, missed, two, zero, zero))
    return ledger.counters.time_copies_s


def test_the_ledger_charges_the_pipeline() -> None:
    g, c = COST.gpu_expert_time, COST.copy_time(1)
    hits = g(3) + g(1)
    # one slot: copy 0 at once, copy 1 once miss 0 (expert 3) started
    start0 = max(c, hits)
    start1 = max(max(c, start0) + c, start0 + g(2))
    end = start1 + g(1)
    assert _charged_copies(1) == pytest.approx(end - (hits + g(2) + g(1)), rel=1e-12)
    # unbounded: back-to-back copies
    start1 = max(2 * c, start0 + g(2))
    assert _charged_copies(3) == pytest.approx(start1 + g(1) - (hits + g(2) + g(1)), rel=1e-12)
    assert _charged_copies(0) == pytest.approx(2 * c, rel=1e-12)  # every copy before any compute
    assert _charged_copies(0) > _charged_copies(1) >= _charged_copies(3)


def test_mixtral_offload_pipelines_by_default_and_never_charges_more() -> None:
    times = {}
    for slots in (0, 1, 3):
        rng = np.random.default_rng(0)  # the same loads for every bound
        engine = OffloadEngine(make_system("mixtral_offload", {"max_loads_in_flight": slots}), GEO, 3, COST)
        engine.prepare(None)
        for s in range(6):
            engine.begin_step(StepInfo(0, 0, s, s, True), 4, 4)
            for layer in range(GEO.n_moe_layers):
                load = np.zeros(8, np.int64)
                load[rng.choice(8, 4, replace=False)] = 1
                engine.plan_layer(layer, torch.from_numpy(load))
            engine.end_step()
        summary = engine.summary()
        times[slots] = summary["modeled_time_s"]
        assert summary["copies_sync"] + summary["copies_scratch"] > 0
    assert times[0] > times[1] >= times[3]
    assert make_system("mixtral_offload").max_loads_in_flight == 3
    with pytest.raises(HarnessError, match="max_loads_in_flight"):
        make_system("mixtral_offload", {"max_loads_in_flight": -1})
