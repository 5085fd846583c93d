"""The decoding loop against a small port of the reference `generate` (the published LLaDA2
modeling code, as used by the TIDE reference implementation): same tokens on the tiny
proxy where the schedules used to differ (steps < block_length with a partly filled first
block, gen_length < steps), with and without the prefix cache."""

from __future__ import annotations

import pytest
import torch

from harness.decode.decoding import DecodeSettings, decode, steps_per_block
from harness.model.llada2 import KVCache
from tests.unit.test_decoding import EOS, MASK, ScriptedModel, settings


def reference_generate(model, prompt: list[int], gen_length: int, block_length: int, steps: int,
                       threshold: float, mask_id: int, eos_id: int, generator: torch.Generator | None = None
                       ) -> list[int]:
    """A port of the reference loop (batch 1, eos_early_stop=False as in the paper's
    evaluation): every step recomputes the whole window from position 0. With a generator it
    samples as the reference evaluation runs it (do_sample=True, temperature 0.0: no division,
    so the softmax at temperature 1, one multinomial draw per position)."""
    steps = min(steps, gen_length)
    n_blocks = (len(prompt) + gen_length + block_length - 1) // block_length
    x = torch.full((n_blocks * block_length,), mask_id, dtype=torch.long)
    x[: len(prompt)] = torch.tensor(prompt)
    base, rem = divmod(block_length, steps)
    schedule = [base + (1 if s < rem else 0) for s in range(steps)]
    for b in range(len(prompt) // block_length, n_blocks):
        end = (b + 1) * block_length
        for s in range(steps):
            active = x[end - block_length : end] == mask_id
            if not active.any():
                break
            logits = model(x[:end], torch.arange(end), block_length)[-block_length:]
            probs = torch.softmax(logits.float(), dim=-1)
            if generator is None:
                p, tok = probs.max(dim=-1)
            else:
                tok = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
                p = probs.gather(-1, tok[:, None]).squeeze(-1)
            confidence = torch.where(active, p, torch.tensor(float("-inf")))
            high = confidence > threshold
            take = torch.zeros_like(active)
            if int(high.sum()) >= schedule[s]:
                take = high
            else:
                take[torch.topk(confidence, k=min(schedule[s], int(active.sum()))).indices] = True
            window = x[end - block_length : end]
            window[take] = tok[take]
        if (x[len(prompt) : end] == eos_id).any():
            break
    return x[len(prompt) : len(prompt) + gen_length].tolist()


CASES = {
    # (prompt text, gen_length, block_length, steps, threshold)
    "steps<block, partial first block": ("Reverse a linked list in place.", 40, 16, 5, 0.9),
    "gen<steps": ("Sort a list of tuples by the second element.", 12, 16, 16, 0.9),
    "gen<steps, one step each": ("Count words.", 6, 8, 8, 1.0),
    "threshold never met": ("Binary search in a sorted list.", 24, 16, 6, 1.0),
    "steps<block, block 32": ("Implement a queue using two stacks in Python.", 40, 32, 7, 0.95),
}


@pytest.mark.parametrize("cache", ["none", "prefix"])
@pytest.mark.parametrize("case", list(CASES))
def test_tokens_equal_the_reference_loop_on_tiny(case, cache, tiny_model, tiny_tokenizer):
    text, gen, block, steps, threshold = CASES[case]
    ids = tiny_tokenizer.encode(text)
    assert len(ids) % block, "the first block must be partly filled by the prompt"
    cfg = tiny_model.config
    expected = reference_generate(tiny_model, ids, gen, block, steps, threshold, cfg.mask_token_id,
                                  cfg.eos_token_id)
    s = DecodeSettings(gen_length=gen, block_length=block, steps=steps, threshold=threshold, cache=cache,
                       eos_early_stop=True)
    out = decode(tiny_model, ids, s, cfg.mask_token_id, cfg.eos_token_id, new_cache=KVCache)
    assert out.generated == expected


def test_partly_filled_first_block_takes_whole_shares_of_block_length():
    # block 8, prompt 5: 3 masked positions; block_length 8 over 4 steps = 2 a step, so the
    # first block takes 2 then 1 (the masked-count rule would have taken 1, 1, 1)
    model = ScriptedModel(lambda i, pos: (pos % 7, torch.full((len(pos),), 0.5)))
    out = decode(model, [1, 2, 3, 4, 5], settings(gen_length=11, block_length=8, steps=4), MASK, EOS)
    first = [r.tokens_unmasked for r in out.records if r.block == 0]
    second = [r.tokens_unmasked for r in out.records if r.block == 1]
    assert first == [2, 1]
    assert second == [2, 2, 2, 2]


def test_steps_are_clamped_to_gen_length():
    s = settings(gen_length=3, block_length=8, steps=8)
    assert steps_per_block(s) == 3
    model = ScriptedModel(lambda i, pos: (pos % 7, torch.full((len(pos),), 0.5)))
    out = decode(model, [1, 2], s, MASK, EOS)
    # 8 over 3 steps = 3, 3, 2: the block's 6 masked positions fill in two steps
    assert [r.tokens_unmasked for r in out.records] == [3, 3]


def reference_bucket_gen_length(prompt_tokens: int, gen_length: int, bucket: int = 32) -> int:
    """eval_dinfer.py's cal_bucket_len: prompt + generation trimmed down to a multiple of the bucket."""
    return bucket * ((prompt_tokens + gen_length) // bucket) - prompt_tokens


@pytest.mark.parametrize(("prompt_tokens", "gen", "want"),
                         [(40, 256, 248), (64, 256, 256), (31, 32, 1), (1, 1024, 1023)])
def test_the_bucket_trims_gen_length_as_the_reference_evaluation(prompt_tokens, gen, want):
    s = DecodeSettings(gen_length=gen, gen_length_bucket=32)
    assert s.for_prompt(prompt_tokens).gen_length == want == reference_bucket_gen_length(prompt_tokens, gen)
    assert s.for_prompt(prompt_tokens).for_prompt(prompt_tokens) == s.for_prompt(prompt_tokens)  # idempotent
    assert DecodeSettings(gen_length=gen).for_prompt(prompt_tokens).gen_length == gen  # no bucket: untouched


@pytest.mark.parametrize("cache", ["none", "prefix"])
def test_sampled_and_bucketed_decode_equals_the_reference_evaluation_on_tiny(cache, tiny_model, tiny_tokenizer):
    """The paper-setting experiments' decode: sampling at temperature 1 with a seeded generator
    and gen_length trimmed to the bucket, token for token against the reference loop."""
    cfg = tiny_model.config
    for text in ("Reverse a linked list in place.", "Implement a queue using two stacks in Python."):
        ids = tiny_tokenizer.encode(text)
        gen = reference_bucket_gen_length(len(ids), 40, bucket=16)
        expected = reference_generate(tiny_model, ids, gen, 16, 16, 0.95, cfg.mask_token_id, cfg.eos_token_id,
                                      generator=torch.Generator().manual_seed(1234))
        s = DecodeSettings(gen_length=40, block_length=16, steps=16, threshold=0.95, temperature=1.0, seed=1234,
                           cache=cache, gen_length_bucket=16)
        out = decode(tiny_model, ids, s.for_prompt(len(ids)), cfg.mask_token_id, cfg.eos_token_id, new_cache=KVCache)
        assert len(out.generated) == gen < 40 and (len(ids) + gen) % 16 == 0
        assert out.generated == expected


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"gen_length_bucket": -1}, "decode.gen_length_bucket=-1 must be >= 0"),
    ({"gen_length": 16, "gen_length_bucket": 32}, "decode.gen_length_bucket=32 exceeds decode.gen_length=16"),
])
def test_a_bad_bucket_is_one_line(kwargs, needle):
    from harness.common.errors import HarnessError

    with pytest.raises(HarnessError, match=needle):
        DecodeSettings(**kwargs)
