"""Lock-step serving (harness/traces/serving.py) on a hand-made recording, and GEM's profiling
cost (systems/gem.py `profiling_cost`), with values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.common.errors import HarnessError
from harness.job.artifacts import cached_trace
from harness.job.replay import require_request_tokens
from harness.model.config import LLaDA2Config
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.traces.serving import Request, lacks_request_tokens, lockstep, serving_figures
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


def ar(forwards: int) -> Request:
    """An autoregressive request: its prefill yields its first token, each forward one."""
    return Request(forwards, 0, forwards)


def test_serving_percentiles_by_hand() -> None:
    # batch 0 forwards take 1, 2, 3 s; batch 1's 10, 20, 30 s
    got = serving_figures([1.0, 2.0, 3.0, 10.0, 20.0, 30.0], [[ar(3), ar(2)], [ar(3)]])
    # tpot: prompt 0 (2 + 3) / 2, prompt 1 2, prompt 2 (20 + 30) / 2; e2e: 6, 3, 6 + 60
    assert got["serving_batches"] == 2
    assert got["tpot_p50_s"] == 2.5 and got["tpot_p90_s"] == pytest.approx(2.5 + 0.8 * 22.5)
    assert got["e2e_latency_p50_s"] == 6.0 and got["e2e_latency_mean_s"] == 25.0
    assert got["e2e_latency_p99_s"] == pytest.approx(6 + 0.98 * 60)


# ---- block diffusion: each request's own forwards, its tokens from the trace meta ----------
# prompt 0: prefill, 2 denoise, commit, 2 denoise; prompt 1 (a prompt shorter than a block, no
# prefill): 3 denoise, commit, 1 denoise; prompt 2: prefill, 1 denoise
DIFFUSION = {0: ["prefill", "denoise", "denoise", "commit", "denoise", "denoise"],
             1: ["denoise", "denoise", "denoise", "commit", "denoise"],
             2: ["prefill", "denoise"]}


def diffusion_recording(tokens: list[int] | None = (5, 4, 1)) -> RoutingTrace:
    """Prompt p, forward t routes 2 tokens in each layer: 1 to expert p, 1 to expert 3 (plus
    t, a marker, on expert 2 when t > 0); its tokens 2 + t, its context 10 p + t."""
    trace = RoutingTrace(2, 4, meta={} if tokens is None else {"generated_per_prompt": list(tokens)})
    g = 0
    for p, kinds in DIFFUSION.items():
        block = 0
        for t, kind in enumerate(kinds):
            trace.add_step(StepInfo(p, block, t, g, block == 0, kind), 2 + t, 10 * p + t)
            for layer in range(2):
                load = torch.zeros(4, dtype=torch.long)
                load[p] += 1
                load[3] += 1
                load[2] += t
                trace.record(layer, load)
            block += kind == "commit"
            g += 1
    return trace


def test_block_diffusion_requests_are_batched_forward_by_forward() -> None:
    served = lockstep(diffusion_recording(), 2)
    merged = served.trace
    assert served.forwards == [[6, 5], [2]]
    # forward 0 carries prompt 0's prefill and prompt 1's first denoising step: named denoise
    assert [s.kind for s in merged.steps[:6]] == ["denoise", "denoise", "denoise", "commit", "denoise", "denoise"]
    assert [s.kind for s in merged.steps[6:]] == ["prefill", "denoise"]
    loads = merged.loads.numpy()
    # forward 4: both requests' t = 4 (markers 4 + 4 on expert 2); forward 5: prompt 0 alone
    assert loads[4, 0].tolist() == [1, 1, 8, 2] and loads[5, 1].tolist() == [1, 0, 5, 1]
    assert merged.n_tokens[:6] == [4, 6, 8, 10, 12, 7] and merged.n_context[:6] == [10, 12, 14, 16, 18, 5]
    assert int(loads.sum()) == int(diffusion_recording().loads.sum())
    requests = served.requests
    assert [(r.forwards, r.first_token, r.tokens) for r in requests[0] + requests[1]] == [(6, 1, 5), (5, 0, 4),
                                                                                           (2, 1, 1)]


def test_block_diffusion_serving_figures_by_hand() -> None:
    served = lockstep(diffusion_recording(), 2)
    # batch 0's forwards take 1 .. 6 s (ends 1, 3, 6, 10, 15, 21); batch 1's 10, 20 s
    got = serving_figures([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 10.0, 20.0], served.requests)
    # tpot: prompt 0 (21 - 3) / (5 - 1) = 4.5; prompt 1 (15 - 1) / (4 - 1); prompt 2 has one token: none
    tpot = [4.5, 14 / 3]
    assert got["tpot_p50_s"] == pytest.approx(np.mean(tpot))
    assert got["tpot_p90_s"] == pytest.approx(tpot[0] + 0.9 * (tpot[1] - tpot[0]))
    # e2e: prompt 0 21, prompt 1 15, prompt 2 21 + 10 + 20
    assert got["e2e_latency_p50_s"] == 21.0 and got["e2e_latency_mean_s"] == pytest.approx((21 + 15 + 51) / 3)
    assert got["serving_batches"] == 2


def test_an_autoregressive_trace_needs_no_token_list() -> None:
    assert not lacks_request_tokens(recording())
    assert lacks_request_tokens(diffusion_recording(None))
    assert not lacks_request_tokens(diffusion_recording())


def test_a_diffusion_trace_without_per_request_tokens_is_refused_in_one_line(tmp_path) -> None:
    trace = diffusion_recording(None)
    lockstep(trace, 2)  # batching alone (a calibration trace) needs no token counts
    with pytest.raises(HarnessError, match=r"record it again .*trace\.record=true.* or use workload\.batch=1") as info:
        require_request_tokens(trace, tmp_path / "trace.npz")
    assert "\n" not in str(info.value) and "generated_per_prompt" in str(info.value)
    with pytest.raises(HarnessError, match="generated_per_prompt"):
        serving_figures([1.0] * 8, lockstep(trace, 2).requests)


def test_a_cached_trace_without_per_request_tokens_is_recorded_again_when_served(tmp_path) -> None:
    old, new = tmp_path / "old.npz", tmp_path / "new.npz"
    diffusion_recording(None).save(old)
    diffusion_recording().save(new)
    assert cached_trace(old) is not None  # unbatched runs still read it
    assert cached_trace(old, lacks_request_tokens) is None  # serving records it again
    assert cached_trace(new, lacks_request_tokens).meta["generated_per_prompt"] == [5, 4, 1]


def test_a_malformed_token_list_is_refused() -> None:
    with pytest.raises(HarnessError, match="must list 3 token counts"):
        lockstep(diffusion_recording((5, 4)), 2)


# ---- GEM's profiling cost -----------------------------------------------------------------
GEO = LLaDA2Config.published("llada2_mini")


def test_profiling_cost_counts_samples_and_the_boundary_curves_error() -> None:
    cost = CostModel(GEO, HardwareConfig())
    speeds = (1.0, 0.8)
    got = profiling_cost(cost, speeds, max_tokens=100, tile=32)
    # boundaries 0, 32, 64, 96, 128 on each GPU; a dense profile samples 0..100
    assert got["gem_profile_samples"] == 2 * 5 and got["gem_dense_profile_samples"] == 2 * 101
    n = np.arange(1, 101)
    dense = cost.grouped_gpu_expert_times(torch.from_numpy(n)).numpy()
    charged = cost.grouped_gpu_expert_times(torch.from_numpy(-(-n // 32) * 32)).numpy()
    error = np.abs(charged - dense) / dense
    assert got["gem_profile_error_mean"] == pytest.approx(error.mean())
    assert got["gem_profile_error_max"] == pytest.approx(error.max())
    assert latency_tables(cost, speeds, 100, 32).shape == (2, 5)


def test_tile_one_profiles_every_count_without_error() -> None:
    got = profiling_cost(CostModel(GEO, HardwareConfig()), (1.0,), max_tokens=40, tile=1)
    assert got["gem_profile_samples"] == got["gem_dense_profile_samples"] == 41
    assert got["gem_profile_error_max"] == 0.0
