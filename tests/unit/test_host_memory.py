"""hardware.host_memory: pinned copies run asynchronously at pcie_gbps; pageable ones at
pcie_pageable_gbps and block the host, so nothing overlaps them."""

from __future__ import annotations

import numpy as np
import pytest

from harness.accounting.cost import CostModel, HardwareConfig
from harness.accounting.ledger import LayerOutcomes, Ledger
from harness.common.errors import HarnessError
from harness.model.config import LLaDA2Config
from harness.placement.steps import StepInfo

GEO = LLaDA2Config(num_hidden_layers=2, num_experts=8, n_group=1, topk_group=1, num_experts_per_tok=4)
PINNED = CostModel(GEO, HardwareConfig(pcie_gbps=10.0))
PAGEABLE = CostModel(GEO, HardwareConfig(pcie_gbps=10.0, host_memory="pageable", pcie_pageable_gbps=5.0))


def expert_time(cost: CostModel, overlap: bool, n_async: int = 1) -> float:
    """Modeled seconds beyond non-expert work of one layer: expert 0 resident on the GPU,
    expert 1 copied sync and computed on the GPU, expert 2 on the CPU, n_async async copies."""
    ledger = Ledger(cost, GEO.n_moe_layers, 8, overlap=overlap)
    loads = np.array([[[4, 2, 3, 0, 0, 0, 0, 0]]])
    on_gpu = np.array([[[True, True, False, False, False, False, False, False]]])
    missed = np.array([[[False, True, True, False, False, False, False, False]]])
    one, zero = np.array([[1]]), np.array([[0]])
    outcome = LayerOutcomes(loads, on_gpu, missed, one, zero, np.array([[n_async]]))
    ledger.charge([StepInfo(0, 0, 0, 0, True)], [(4, 4)], outcome)
    c = ledger.counters
    return c.time_gpu_experts_s + c.time_cpu_experts_s + c.time_copies_s


def test_pageable_copies_are_slower_and_block_everything() -> None:
    g, cpu = PINNED.gpu_expert_time, PINNED.cpu_expert_time(3)
    gpu = g(4) + g(2)
    c_pin, c_page = PINNED.copy_time(1), PAGEABLE.copy_time(1)
    assert c_page > c_pin
    # pinned, overlapped: the CPU expert runs from the layer's start, beside copy + GPU
    assert expert_time(PINNED, True, n_async=0) == pytest.approx(max(c_pin + gpu, cpu), rel=1e-12)
    # pinned: an async copy runs behind the layer's work, partly hidden (pageable: not at all)
    assert expert_time(PINNED, True, n_async=0) < expert_time(PINNED, True) < 2 * c_pin + max(gpu, cpu)
    # pageable: both copies first (the async one too), then GPU and CPU side by side
    assert expert_time(PAGEABLE, True) == pytest.approx(2 * c_page + max(gpu, cpu), rel=1e-12)
    assert expert_time(PAGEABLE, False) == pytest.approx(2 * c_page + gpu + cpu, rel=1e-12)


def test_pageable_needs_its_measured_bandwidth() -> None:
    with pytest.raises(HarnessError, match="pcie_pageable_gbps"):
        HardwareConfig(host_memory="pageable")
    with pytest.raises(HarnessError, match="host_memory"):
        HardwareConfig(host_memory="mapped")
