"""Lock-step serving (harness/traces/serving.py) on a hand-made recording, and GEM's profiling
cost (systems/gem.py `profiling_cost`), with values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.common.errors import HarnessError
from harness.model.config import LLaDA2Config
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.traces.serving import lockstep, serving_figures
from systems.gem import latency_tables, profiling_cost

# 3 prompts x (prefill + decode forwards): prompt 0 has 2 decode forwards, prompt 1 one, prompt 2 two
FORWARDS = {0: 3, 1: 2, 2: 3}


def recording(kinds_of_first: str = "prefill") -> RoutingTrace:
    """Loads of prompt p, forward t, layer l: expert (p + t + l) % 4 gets 10p + t + 1 tokens."""
    trace = RoutingTrace(2, 4)
    g = 0
    for p, n in FORWARDS.items():
        for t in range(n):
            kind = kinds_of_first if t == 0 else "decode"
            trace.add_step(StepInfo(p, 0, t, g, True, kind), 5 if t == 0 else 1, 5 + t)
            for layer in range(2):
                load = torch.zeros(4, dtype=torch.long)
                load[(p + t + layer) % 4] = 10 * p + t + 1
                trace.record(layer, load, torch.full((4,), float(p + 1)))
            g += 1
    return trace


def test_a_batch_sums_its_requests_forward_by_forward() -> None:
    served = lockstep(recording(), 2)
    merged = served.trace
    assert served.forwards == [[3, 2], [3]]
    assert [s.kind for s in merged.steps] == ["prefill", "decode", "decode"] * 2
    assert [s.prompt for s in merged.steps] == [0, 0, 0, 1, 1, 1]
    loads = merged.loads.numpy()
    # batch 0, forward 1, layer 0: prompt 0 -> expert 1 (2 tokens), prompt 1 -> expert 2 (12 tokens)
    assert loads[1, 0].tolist() == [0, 2, 12, 0]
    # forward 2 of batch 0 carries prompt 0 alone: expert (0 + 2 + 1) % 4 = 3 in layer 1, 3 tokens
    assert loads[2, 1].tolist() == [0, 0, 0, 3]
    assert merged.n_tokens[:3] == [10, 2, 1] and merged.n_context[:3] == [10, 12, 7]
    assert merged.step_hints(1)[0].tolist() == [3.0] * 4  # hints 1 + 2
    assert int(loads.sum()) == int(recording().loads.sum())


def test_batch_one_keeps_every_forward() -> None:
    trace = recording()
    served = lockstep(trace, 1)
    assert torch.equal(served.trace.loads, trace.loads) and served.forwards == [[3], [2], [3]]


def test_serving_percentiles_by_hand() -> None:
    # batch 0 forwards take 1, 2, 3 s; batch 1's 10, 20, 30 s
    got = serving_figures([1.0, 2.0, 3.0, 10.0, 20.0, 30.0], [[3, 2], [3]])
    # tpot: prompt 0 (2 + 3) / 2, prompt 1 2, prompt 2 (20 + 30) / 2; e2e: 6, 3, 6 + 60
    assert got["serving_batches"] == 2
    assert got["tpot_p50_s"] == 2.5 and got["tpot_p90_s"] == pytest.approx(2.5 + 0.8 * 22.5)
    assert got["e2e_latency_p50_s"] == 6.0 and got["e2e_latency_mean_s"] == 25.0
    assert got["e2e_latency_p99_s"] == pytest.approx(6 + 0.98 * 60)


def test_a_diffusion_recording_is_refused_in_one_line() -> None:
    with pytest.raises(HarnessError, match="serves autoregressive recordings") as info:
        lockstep(recording("denoise"), 2)
    assert "\n" not in str(info.value)


# ---- GEM's profiling cost -----------------------------------------------------------------
GEO = LLaDA2Config.published("llada2_mini")


def test_profiling_cost_counts_samples_and_the_boundary_curves_error() -> None:
    cost = CostModel(GEO, HardwareConfig())
    speeds = (1.0, 0.8)
    got = profiling_cost(cost, speeds, max_tokens=100, tile=32)
    # boundaries 0, 32, 64, 96, 128 on each GPU; a dense profile samples 0..100
    assert got["gem_profile_samples"] == 2 * 5 and got["gem_dense_profile_samples"] == 2 * 101
    n = np.arange(1, 101)
    dense = cost.gpu_expert_times(torch.from_numpy(n)).numpy()
    charged = cost.gpu_expert_times(torch.from_numpy(-(-n // 32) * 32)).numpy()
    error = np.abs(charged - dense) / dense
    assert got["gem_profile_error_mean"] == pytest.approx(error.mean())
    assert got["gem_profile_error_max"] == pytest.approx(error.max())
    assert latency_tables(cost, speeds, 100, 32).shape == (2, 5)


def test_tile_one_profiles_every_count_without_error() -> None:
    got = profiling_cost(CostModel(GEO, HardwareConfig()), (1.0,), max_tokens=40, tile=1)
    assert got["gem_profile_samples"] == got["gem_dense_profile_samples"] == 41
    assert got["gem_profile_error_max"] == 0.0
