"""The two next-layer hint channels (harness/model/hints.py, docs/dali-and-gem.md "Prefetch:
the predictor"): the residual hint computed by hand from hand-made activations in both
model paths, both channels in one recording and through save/load, older and stand-in
traces, dali's `predictor` choosing the channel, and the one-line refusal of a trace
without the channel it reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.accounting.cost import CostModel, HardwareConfig
from harness.common.errors import HarnessError
from harness.engine.engine import OffloadEngine
from harness.families.bridge import attach, detach
from harness.job.replay import check_hint_channel
from harness.model.config import LLaDA2Config
from harness.model.hints import NEXT_GATE, RESIDUAL, RunningMean
from harness.model.llada2 import MoE, Router
from harness.placement.trace import RoutingTrace
from systems.registry import make_system
from tests.family_models import forward_logits, tiny_model
from tests.system_drive import geometry, loads, step
from tests.unit.test_dali import dali, profile

CFG = LLaDA2Config(hidden_size=16, moe_intermediate_size=8, num_hidden_layers=3, num_experts=8, n_group=1,
                   topk_group=1, num_experts_per_tok=2)


class BothChannels:
    """An expert engine that asks every hint channel and computes no experts."""

    def __init__(self) -> None:
        self.hints: list[dict[str, torch.Tensor]] = []

    def run_experts(self, layer, x, topk_idx, topk_w, experts, hint_fn):
        self.hints.append({c: hint_fn(c) for c in (NEXT_GATE, RESIDUAL)})
        return torch.zeros_like(x, dtype=torch.float32)

    def route(self, layer, load, hint_fn) -> None:  # the bridge's side
        self.hints.append({c: hint_fn(c) for c in (NEXT_GATE, RESIDUAL)} if hint_fn is not None else {})


def _moe_and_next_gate() -> tuple[MoE, Router]:
    torch.manual_seed(0)
    moe, nxt = MoE(CFG, 0), Router(CFG)
    for p in [*moe.parameters(), *nxt.parameters()]:
        torch.nn.init.normal_(p, std=0.5)
    return moe, nxt


def test_llada2_residual_hint_is_the_next_gate_on_the_input_minus_the_running_mean_by_hand() -> None:
    moe, nxt = _moe_and_next_gate()
    engine = BothChannels()
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(t, CFG.hidden_size, generator=gen) + 2.0 for t in (5, 3, 4)]  # a mean far from zero
    with torch.inference_mode():
        for x in xs:
            moe(x, engine, nxt)
    gate = lambda rows: torch.sigmoid(torch.nn.functional.linear(rows.float(), nxt.weight.float())).sum(0)  # noqa: E731
    for x, hints in zip(xs, engine.hints, strict=True):
        assert torch.equal(hints[NEXT_GATE], gate(x))  # the next_gate channel: unchanged
    # the first forward has seen nothing: its mean is zero, both channels agree
    assert torch.equal(engine.hints[0][RESIDUAL], engine.hints[0][NEXT_GATE])
    # later forwards: the mean of every earlier row (float64 sums per forward, then fp32)
    mean1 = (xs[0].double().sum(0) / 5).float()
    assert torch.equal(engine.hints[1][RESIDUAL], gate(xs[1] - mean1))
    mean2 = ((xs[0].double().sum(0) + xs[1].double().sum(0)) / 8).float()
    assert torch.equal(engine.hints[2][RESIDUAL], gate(xs[2] - mean2))
    torch.testing.assert_close(mean2, torch.cat(xs[:2]).mean(0), rtol=0, atol=1e-6)
    assert not torch.allclose(engine.hints[2][RESIDUAL], engine.hints[2][NEXT_GATE])
    # a reset (the model attached to another engine) starts again from zero
    moe.running_mean.reset()
    with torch.inference_mode():
        moe(xs[2], engine, nxt)
    assert torch.equal(engine.hints[3][RESIDUAL], engine.hints[3][NEXT_GATE])


def test_running_mean_counts_rows_of_any_leading_shape() -> None:
    mean = RunningMean()
    mean.update(torch.ones(2, 3, 4))
    mean.update(torch.full((2, 4), 4.0))
    assert mean.count == 8 and torch.equal(mean.mean(torch.zeros(1, 4)), torch.full((4,), 1.75))


def test_bridge_residual_hint_uses_the_layers_running_mean_of_its_router_input() -> None:
    """qwen3 tiny, two forwards: MoE layer 0's residual hint in the second is the next
    router on its input minus the mean of the first forward's router-input rows."""
    adapter, model = tiny_model("qwen3_moe")
    gates = [model.model.layers[0].mlp.gate, model.model.layers[2].mlp.gate]
    seen: list[torch.Tensor] = []
    hook = gates[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    router = BothChannels()
    attach(model, router)
    forward_logits(adapter, model, torch.arange(10)[None])
    per_forward = len(router.hints)
    forward_logits(adapter, model, torch.arange(5, 12)[None])
    detach(model)
    hook.remove()
    first, second = router.hints[0], router.hints[per_forward]
    probs = lambda rows: adapter.router_probs(gates[1], rows).sum(0)  # noqa: E731
    assert torch.equal(first[NEXT_GATE], probs(seen[0])) and torch.equal(first[RESIDUAL], first[NEXT_GATE])
    rows = seen[0].reshape(-1, seen[0].shape[-1])
    mean = (rows.double().sum(0) / rows.shape[0]).float()
    assert torch.equal(second[NEXT_GATE], probs(seen[1]))
    assert torch.equal(second[RESIDUAL], probs((seen[1].float() - mean).to(seen[1].dtype)))
    assert not torch.equal(second[RESIDUAL], second[NEXT_GATE])


def _two_channel_trace() -> RoutingTrace:
    trace = RoutingTrace(2, 4, meta={"model": "synthetic"})
    for s in range(3):
        trace.add_step(step(0, 0, s), 2, 2)
        trace.record(0, torch.tensor([1, 1, 0, 2]), {NEXT_GATE: torch.tensor([0.1, 0.2, 0.3, 0.4 + s]),
                                                     RESIDUAL: torch.tensor([0.9, 0.0, 0.5, s])})
        trace.record(1, torch.tensor([0, 2, 2, 0]))
    return trace


def test_both_channels_round_trip_and_an_older_trace_has_only_next_gate(tmp_path) -> None:
    trace = _two_channel_trace()
    back = RoutingTrace.load(trace.save(tmp_path / "t.npz"))
    for s in range(3):
        for c in (NEXT_GATE, RESIDUAL):
            assert torch.equal(back.step_hints(s, c), trace.step_hints(s, c))
    assert torch.equal(back.hint(2, 0, RESIDUAL), torch.tensor([0.9, 0.0, 0.5, 2.0]))
    assert torch.equal(back.hint(2, 0), torch.tensor([0.1, 0.2, 0.3, 2.4]))  # next_gate: the default channel
    # an older recording (next_gate only, the file's `hints` array) loads without the residual channel
    with np.load(tmp_path / "t.npz") as z:
        data = {k: z[k] for k in z.files if k != "residual_hints"}
    np.savez_compressed(tmp_path / "old.npz", **data)
    old = RoutingTrace.load(tmp_path / "old.npz")
    assert old.has_hints and not old.has_channel(RESIDUAL) and old.step_hints(0, RESIDUAL) is None
    # a stand-in trace's hints (an import's true next loads, a generated trace's) serve every channel
    old.meta["hints"] = "generated"
    assert old.has_channel(RESIDUAL) and torch.equal(old.hint(1, 0, RESIDUAL), old.hint(1, 0))


def test_a_recording_engine_records_both_channels_and_the_system_reads_its_own() -> None:
    """A live layer hands decide every channel: the trace keeps both, dali reads its predictor's."""
    seen: dict[str, torch.Tensor | None] = {}
    channels = {NEXT_GATE: torch.arange(8.0), RESIDUAL: torch.arange(8.0).flip(0)}
    for predictor in ("residual", "next_gate"):
        system = make_system("dali", {"predictor": predictor})
        original = system.plan

        def spy(layer, load, hint, resident, original=original, predictor=predictor):
            if layer == 0:
                seen[predictor] = hint
            return original(layer, load, hint, resident)

        system.plan = spy
        trace = RoutingTrace(2, 8)
        eng = OffloadEngine(system, geometry(2, 8), 2, _cost(), trace=trace)
        eng.prepare(profile(2, 8, [0, 1]))
        assert eng.hint_channels == (NEXT_GATE, RESIDUAL)
        eng.begin_step(step(1, 0, 0), 4, 4)
        eng.plan_layer(0, loads(8, e0=1), eng.live_hints(lambda c: channels[c]))
        eng.plan_layer(1, loads(8, e1=1))
        eng.end_step()
        assert torch.equal(trace.hint(0, 0, NEXT_GATE), channels[NEXT_GATE])
        assert torch.equal(trace.hint(0, 0, RESIDUAL), channels[RESIDUAL])
        assert torch.equal(seen[predictor], channels[predictor])
    # without a trace, only the system's own channel is computed
    assert OffloadEngine(make_system("dali", {}), geometry(2, 8), 2, _cost()).hint_channels == (RESIDUAL,)
    assert OffloadEngine(make_system("mixtral_offload", {"prefetch": True}), geometry(2, 8), 2,
                         _cost()).hint_channels == (NEXT_GATE,)


def _cost() -> CostModel:
    return CostModel(geometry(2, 8), HardwareConfig())


@pytest.mark.parametrize("predictor", ["residual", "next_gate"])
def test_dali_predictor_chooses_the_channel_its_prefetch_reads(predictor: str) -> None:
    """One replay over a hand-made trace whose channels disagree about layer 1: the
    residual one names expert 7, the next_gate one expert 6; the prefetch follows its own."""
    trace = RoutingTrace(2, 8)
    trace.add_step(step(1, 0, 0), 4, 4)
    trace.record(0, loads(8, e0=1, e2=8, e3=8, e4=8, e5=8, e7=8), {
        NEXT_GATE: torch.tensor([5.0, 0.1, 0, 0, 0, 0, 3.0, 2.0]),
        RESIDUAL: torch.tensor([5.0, 0.1, 0, 0, 0, 0, 2.0, 3.0])})
    trace.record(1, loads(8, e6=3, e7=3, e0=1))
    eng = dali({"prefetch_k": 2, "predictor": predictor}, geometry(2, 8))  # both layers hold {0, 1}
    assert eng.system.hint_channel == predictor
    eng.replay(trace)
    assert eng.system.counts["prefetched"] == 1
    assert eng.layer_resident(1) == ({0, 7} if predictor == "residual" else {0, 6})


def test_a_bad_predictor_is_a_one_line_error() -> None:
    with pytest.raises(HarnessError, match=r"system\.predictor must be one of residual, next_gate"):
        make_system("dali", {"predictor": "oracle"})


def test_a_trace_without_the_residual_channel_is_refused_with_the_fix(tmp_path) -> None:
    trace = _two_channel_trace()
    older = RoutingTrace(2, 4)
    for s in range(3):
        older.add_step(trace.steps[s], 2, 2)
        older.set_step(s, trace.loads[s].numpy(), trace.step_hints(s).numpy())
    residual, next_gate = make_system("dali", {}), make_system("dali", {"predictor": "next_gate"})
    with pytest.raises(HarnessError) as err:
        check_hint_channel(older, residual, tmp_path / "t.npz")
    message = str(err.value)
    assert "\n" not in message and "carries no residual hints" in message
    assert "record the trace again, or set system.predictor=next_gate" in message
    check_hint_channel(older, next_gate, tmp_path / "t.npz")  # its own channel is there
    check_hint_channel(trace, residual, tmp_path / "t.npz")
    check_hint_channel(RoutingTrace(2, 4), residual, tmp_path / "t.npz")  # no hints at all: predicts nothing
    older.meta["hints"] = "next_layer_loads"  # an import's perfect predictor stands in for every channel
    check_hint_channel(older, residual, tmp_path / "t.npz")
