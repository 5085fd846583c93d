"""Greedy autoregressive decoding of a transformers MoE model (Mixtral, Qwen3-MoE, OLMoE, ...)
through transformers' own `generate` with the KV cache, each model forward announced to
an `on_forward(StepInfo, n_tokens, n_context)` hook before it runs (as the block-diffusion
loop in decoding.py does), so the runner can connect the hook to the engine. The decode
driver of the autoregressive family entries (harness/zoo/families.py): `ar_driver`.

Forwards: one prefill over the prompt (it yields the first token), then one forward per
further token over the last token. With EOS after t tokens there are t forwards.

StepInfo for an autoregressive model (a rule defined over the steps of a block, such as
TIDE's refresh interval tau, reads a block as a window of decode steps):
  prefill   kind "prefill", block 0, step 0, is_first_block True
  decode d  (the d-th forward after the prefill, d = 0, 1, ...; it yields token d + 1)
            kind `decode_kind` ("decode"), block d // window, step d % window,
            is_first_block block == 0
n_tokens is the forward's input length (prompt length, then 1); n_context the tokens its
attention sees (cached + new). Time to first token is the prefill forward; each decode
forward is one output token (time per output token); both are derivable from `records`
(ForwardRecord.tokens_unmasked is 1 for every forward: each yields one token).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.common.errors import HarnessError
from harness.decode.decoding import DecodeOutput, DecodeSettings, ForwardRecord, OnForward
from harness.decode.loading import LoadedModel
from harness.placement.steps import ForwardKind, StepInfo

DECODE_KIND: ForwardKind = "decode"
DEFAULT_WINDOW = 32


class _Announcer:
    """A forward pre-hook that numbers the forwards and announces each before it runs."""

    def __init__(self, hook: OnForward | None, prompt: int, first_global_step: int, window: int,
                 decode_kind: ForwardKind) -> None:
        self.hook, self.prompt, self.global_step = hook, prompt, first_global_step
        self.window, self.decode_kind = window, decode_kind
        self.records: list[ForwardRecord] = []

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs["inputs_embeds"]
        n_tokens = int(ids.shape[1])
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        n_context = (int(cache.get_seq_length()) if cache is not None else 0) + n_tokens
        if not self.records:
            info = StepInfo(self.prompt, 0, 0, self.global_step, True, "prefill")
        else:
            d = len(self.records) - 1
            block = d // self.window
            info = StepInfo(self.prompt, block, d % self.window, self.global_step, block == 0, self.decode_kind)
        if self.hook is not None:
            self.hook(info, n_tokens, n_context)
        self.global_step += 1
        self.records.append(ForwardRecord(self.prompt, info.block, info.step, info.kind, n_tokens, 1))


def ar_generate(
    model: nn.Module,
    prompt_ids: list[int],
    gen_length: int,
    eos_id: int | None,
    on_forward: OnForward | None = None,
    window: int = DEFAULT_WINDOW,
    prompt_index: int = 0,
    first_global_step: int = 0,
    decode_kind: ForwardKind = DECODE_KIND,
) -> DecodeOutput:
    """Greedy decoding of one prompt (module docstring). `generated` holds the tokens
    produced (fewer than gen_length when EOS came first; EOS included)."""
    from transformers import GenerationConfig

    if gen_length <= 0 or window <= 0:
        raise HarnessError(f"gen_length={gen_length} and window={window} must be positive")
    if not prompt_ids:
        raise HarnessError("an autoregressive model needs a non-empty prompt")
    announcer = _Announcer(on_forward, prompt_index, first_global_step, window, decode_kind)
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=gen_length, min_new_tokens=0,
                              eos_token_id=eos_id, pad_token_id=eos_id, use_cache=True)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=_device(model))
    handle = model.register_forward_pre_hook(announcer, with_kwargs=True)
    try:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    finally:
        handle.remove()
    generated = out[0, len(prompt_ids):].tolist()
    stopped = eos_id is not None and eos_id in generated
    n_generated = generated.index(eos_id) + 1 if stopped else len(generated)
    return DecodeOutput(list(prompt_ids), generated[:n_generated], n_generated, announcer.records, stopped)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def ar_driver(loaded: LoadedModel, ids: list[int], settings: DecodeSettings, hook: OnForward, prompt: int,
              first_global_step: int) -> DecodeOutput:
    """One prompt, greedily: decode.gen_length tokens at most, windows of decode.block_length
    decode steps (the module docstring); its first EOS id stops it."""
    return ar_generate(loaded.model, ids, settings.gen_length, loaded.eos_ids[0], hook, window=settings.block_length,
                       prompt_index=prompt, first_global_step=first_global_step)
