"""The decode drivers of the transformers families: greedy autoregressive decoding through
`generate` and DiffusionGemma's own `generate`, each forward announced before it runs."""

from __future__ import annotations

import pytest
import torch

from harness.common.errors import HarnessError
from harness.families.bridge import attach, detach
from harness.families.registry import geometry_of
from harness.zoo.ar_generate import ar_generate
from harness.zoo.diffusiongemma_generate import diffusiongemma_generate
from tests.family_models import EOS, FAMILIES, RecordingRouter, tiny_model

PROMPT = [5, 9, 2, 7, 11, 3]


class ForwardLog(RecordingRouter):
    """The hook and the router together: each forward's loads grouped under its announcement."""

    def __init__(self) -> None:
        super().__init__()
        self.forwards: list[tuple] = []  # (StepInfo, n_tokens, n_context, first call index)

    def on_forward(self, info, n_tokens, n_context) -> None:
        self.forwards.append((info, n_tokens, n_context, len(self.calls)))

    def loads_of(self, i: int) -> list[tuple[int, torch.Tensor]]:
        end = self.forwards[i + 1][3] if i + 1 < len(self.forwards) else len(self.calls)
        return [(layer, load) for layer, load, _ in self.calls[self.forwards[i][3] : end]]


def _run(name: str, log: ForwardLog | None, **kw):
    adapter, model = tiny_model(name)
    if log is not None:
        attach(model, log)
    try:
        if adapter.kind == "ar":
            out = ar_generate(model, PROMPT, kw.get("gen", 10), kw.get("eos", EOS),
                              log.on_forward if log else None, window=4)
        else:
            out = diffusiongemma_generate(model, PROMPT, kw.get("gen", 12), 8, kw.get("steps", 5), kw.get("seed", 0),
                                          kw.get("eos", EOS), log.on_forward if log else None)
    finally:
        detach(model)
    return out, geometry_of(model)


@pytest.mark.parametrize("name", FAMILIES)
def test_bridged_generation_equals_stock_and_every_forward_routes_n_tokens_times_k(name):
    stock, _ = _run(name, None)
    log = ForwardLog()
    bridged, g = _run(name, log)
    assert bridged.generated == stock.generated
    assert len(log.forwards) == len(bridged.records) > 0
    for i, (info, n_tokens, _, _) in enumerate(log.forwards):
        loads = log.loads_of(i)
        assert [layer for layer, _ in loads] == list(range(g.n_moe_layers))
        assert all(int(load.sum()) == n_tokens * g.num_experts_per_tok for _, load in loads)
        record = bridged.records[i]
        assert (record.kind, record.block, record.step, record.tokens_routed) == (
            info.kind, info.block, info.step, n_tokens)
        assert info.global_step == i


def test_autoregressive_forwards_are_a_prefill_then_one_per_token_in_windows():
    log = ForwardLog()
    out, _ = _run("qwen3_moe", log, gen=10)
    steps = [(f[0].kind, f[0].block, f[0].step, f[0].is_first_block, f[1], f[2]) for f in log.forwards]
    assert steps[0] == ("prefill", 0, 0, True, len(PROMPT), len(PROMPT))
    assert len(steps) == len(out.generated) == out.n_generated
    for d, (kind, block, step, first, n_tokens, n_context) in enumerate(steps[1:]):
        assert (kind, block, step, first, n_tokens) == ("decode", d // 4, d % 4, d < 4, 1)
        assert n_context == len(PROMPT) + d + 1


def test_autoregressive_decoding_stops_at_eos():
    first = _run("mixtral", None, gen=10)[0].generated[0]
    out, _ = _run("mixtral", None, gen=10, eos=first)
    assert out.generated == [first] and out.n_generated == 1 and out.stopped_at_eos
    assert [r.kind for r in out.records] == ["prefill"]


def test_diffusiongemma_forwards_are_prefill_denoise_steps_and_commits_per_canvas():
    log = ForwardLog()
    out, _ = _run("diffusiongemma", log, gen=12, steps=5)
    kinds = [(f[0].kind, f[0].block, f[0].step, f[1], f[2]) for f in log.forwards]
    assert kinds[0] == ("prefill", 0, 0, len(PROMPT), len(PROMPT))
    canvases = [k for k in kinds if k[0] == "denoise"]
    assert {c[1] for c in canvases} == {0, 1}  # ceil(12 / 8) canvases of 8
    per_canvas = [sum(1 for c in canvases if c[1] == b) for b in (0, 1)]
    assert all(1 <= n <= 5 for n in per_canvas)
    commit = kinds[1 + per_canvas[0]]
    assert commit == ("commit", 0, per_canvas[0], 8, len(PROMPT) + 8)  # canvas 0 into the KV cache
    assert all(c[3] == 8 for c in canvases)
    assert [c[2] for c in canvases if c[1] == 1] == list(range(per_canvas[1]))
    assert all(c[4] == len(PROMPT) + 8 * (1 + c[1]) for c in canvases)
    assert len(out.generated) == 12 and [r.kind for r in out.records].count("commit") == 1


def test_diffusiongemma_sampling_is_seeded_and_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = _run("diffusiongemma", None, seed=0)[0].generated
    assert torch.equal(torch.get_rng_state(), before)
    assert _run("diffusiongemma", None, seed=0)[0].generated == a
    assert _run("diffusiongemma", None, seed=1)[0].generated != a


def test_bad_decode_settings_are_errors():
    _, model = tiny_model("mixtral")
    with pytest.raises(HarnessError, match="must be positive"):
        ar_generate(model, PROMPT, 0, EOS)
    _, model = tiny_model("diffusiongemma")
    with pytest.raises(HarnessError, match="non-empty prompt"):
        diffusiongemma_generate(model, [], 8, 8, 4, 0, EOS)
