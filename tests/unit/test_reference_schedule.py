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
                       threshold: float, mask_id: int, eos_id: int) -> list[int]:
    """A port of the reference loop (greedy, batch 1, eos_early_stop=False as in the paper's
    evaluation): every step recomputes the whole window from position 0."""
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
            p, tok = torch.softmax(logits.float(), dim=-1).max(dim=-1)
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
