"""The block-diffusion loop on a scripted stub model, and on the tiny proxy."""

from __future__ import annotations

import torch

from harness.decode.decoding import DecodeSettings, decode, select_positions, transfer_schedule
from harness.model.llada2 import KVCache

MASK, EOS, VOCAB = 99, 98, 100


class ScriptedModel:
    """Returns logits from a script: fn(call_index, positions) -> (token [T], prob [T])."""

    def __init__(self, script):
        self.script, self.calls = script, []

    def __call__(self, ids, positions, block_length, cache=None, commit=False):
        self.calls.append((positions.clone(), commit))
        tok, prob = self.script(len(self.calls) - 1, positions)
        logits = torch.full((len(positions), VOCAB), -1e4)
        # put `prob` on tok and spread the rest evenly over the other tokens
        rest = (1 - prob) / (VOCAB - 1)
        logits[:] = torch.log(rest)[:, None]
        logits[torch.arange(len(positions)), tok] = torch.log(prob)
        if cache is not None and commit:
            cache.keys = [torch.zeros(1, int(positions[-1]) + 1, 1)]
        return logits


def settings(**kw) -> DecodeSettings:
    base = dict(gen_length=8, block_length=4, steps=4, threshold=0.9, cache="none", eos_early_stop=True)
    base.update(kw)
    return DecodeSettings(**base)


def test_transfer_schedule_spreads_evenly():
    assert transfer_schedule(10, 4) == [3, 3, 2, 2]
    assert transfer_schedule(4, 4) == [1, 1, 1, 1]
    assert sum(transfer_schedule(7, 3)) == 7


def test_select_positions_threshold_then_top_count():
    masked = torch.tensor([True, True, True, False])
    conf = torch.tensor([0.95, 0.5, 0.97, 0.99])
    # two above threshold (the unmasked 0.99 does not count) -> both taken, more than count 1
    assert select_positions(conf, masked, 0.9, 1).tolist() == [True, False, True, False]
    # none above a high threshold -> the top-count by confidence
    assert select_positions(conf, masked, 0.999, 2).tolist() == [True, False, True, False]
    assert select_positions(conf, masked, 0.999, 1).tolist() == [False, False, True, False]


def test_threshold_rule_unmasks_confident_tokens_in_one_step():
    # every position confident -> each block finishes in one step
    model = ScriptedModel(lambda i, pos: (pos % 7, torch.full((len(pos),), 0.99)))
    out = decode(model, [1, 2, 3, 4], settings(), MASK, EOS)
    assert [r.tokens_unmasked for r in out.records] == [4, 4]
    assert out.generated == [(p % 7) for p in range(4, 12)]


def test_schedule_fallback_takes_most_confident_first():
    # nothing reaches the threshold; confidence rises with position -> last positions first
    def script(i, pos):
        return pos % 7, 0.1 + 0.01 * (pos % 4).float()

    model = ScriptedModel(script)
    out = decode(model, [1, 2, 3, 4], settings(gen_length=4), MASK, EOS)
    assert [r.tokens_unmasked for r in out.records] == [1, 1, 1, 1]
    assert len(model.calls) == 4
    assert out.n_generated == 4


def test_eos_stops_after_the_block_that_wrote_it():
    model = ScriptedModel(lambda i, pos: (torch.where(pos == 5, EOS, 3), torch.full((len(pos),), 0.99)))
    out = decode(model, [1, 2, 3, 4], settings(gen_length=12), MASK, EOS)
    assert out.stopped_at_eos
    assert out.generated[:4] == [3, EOS, 3, 3] and out.generated[4:] == [MASK] * 8
    assert out.n_generated == 2  # up to and including EOS
    out = decode(model, [1, 2, 3, 4], settings(gen_length=12, eos_early_stop=False), MASK, EOS)
    assert not out.stopped_at_eos and MASK not in out.generated


def test_prompt_partial_block_is_decoded_with_first_tokens():
    # prompt of 6 with block 4: positions 4,5 are prompt; 6,7 are the first generated tokens
    model = ScriptedModel(lambda i, pos: (pos % 7, torch.full((len(pos),), 0.99)))
    out = decode(model, [1, 2, 3, 4, 5, 6], settings(gen_length=2), MASK, EOS)
    assert out.generated == [6 % 7, 7 % 7]
    assert out.records[0].block == 1 and out.records[0].tokens_unmasked == 2


def test_prefix_cache_runs_prefill_block_and_commit_forwards():
    model = ScriptedModel(lambda i, pos: (pos % 7, torch.full((len(pos),), 0.99)))
    out = decode(model, [1, 2, 3, 4, 5, 6], settings(gen_length=6, cache="prefix"), MASK, EOS, new_cache=KVCache)
    kinds = [(r.kind, r.tokens_routed) for r in out.records]
    assert kinds == [("prefill", 4), ("denoise", 4), ("commit", 4), ("denoise", 4)]
    # only the current block is computed after the prefill
    assert model.calls[1][0].tolist() == [4, 5, 6, 7]


def test_on_forward_hook_sees_every_forward_in_order():
    seen = []
    model = ScriptedModel(lambda i, pos: (pos % 7, torch.full((len(pos),), 0.5)))
    decode(model, [1], settings(gen_length=7), MASK, EOS, on_forward=lambda s, n, c: seen.append((s, n, c)),
           first_global_step=10)
    assert [s.global_step for s, _, _ in seen] == list(range(10, 10 + len(seen)))
    assert all(s.is_first_block == (s.block == 0) for s, _, _ in seen)
    assert seen[0][0].step == 0 and seen[1][0].step == 1


def test_prefix_and_none_give_the_same_tokens_on_tiny(tiny_model, tiny_tokenizer):
    ids = tiny_tokenizer.encode("Write a function that reverses a linked list in place.")
    cfg = tiny_model.config
    outs = {}
    for cache in ("prefix", "none"):
        s = DecodeSettings(gen_length=40, block_length=16, steps=8, cache=cache, threshold=0.9)
        outs[cache] = decode(tiny_model, ids, s, cfg.mask_token_id, cfg.eos_token_id, new_cache=KVCache)
    assert outs["prefix"].generated == outs["none"].generated
    assert cfg.mask_token_id not in outs["prefix"].generated
    assert len(set(outs["prefix"].generated)) > 1  # a non-degenerate output


def test_two_runs_give_the_same_tokens_with_sampling(tiny_model, tiny_tokenizer):
    ids = tiny_tokenizer.encode("Sort a list of tuples by the second element.")
    cfg = tiny_model.config
    s = DecodeSettings(gen_length=16, block_length=8, steps=8, temperature=0.7, seed=3)
    a = decode(tiny_model, ids, s, cfg.mask_token_id, cfg.eos_token_id, new_cache=KVCache)
    b = decode(tiny_model, ids, s, cfg.mask_token_id, cfg.eos_token_id, new_cache=KVCache)
    assert a.generated == b.generated
