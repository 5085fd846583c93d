"""DiffusionGemma decoding through its own `generate` and sampler (entropy-bound acceptance,
renoising, self-conditioning, stable-and-confident stopping), seeded, with every model
forward announced to an `on_forward(StepInfo, n_tokens, n_context)` hook before it runs.

DiffusionGemma's `generate` encodes the prompt with its causal encoder, then denoises one
canvas of `canvas_length` tokens with its bidirectional decoder for up to `steps` steps,
then encodes that canvas into the KV cache and denoises the next one. The forwards map
onto the block-diffusion loop's kinds (decoding.py):
  encoder over the prompt      kind "prefill", block 0, step 0, is_first_block True
  decoder, step s of canvas c  kind "denoise", block c, step s, is_first_block c == 0
  encoder over finished c      kind "commit", block c, step = the steps canvas c took
                               (as LLaDA2's commit of a finished block; the last canvas
                               is never encoded)
n_tokens is the forward's input length (the prompt, or canvas_length); n_context the
tokens its attention sees: those already encoded plus its own. The decode driver of the
DiffusionGemma entry (harness/zoo/families.py): `diffusiongemma_driver`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.common.errors import HarnessError
from harness.decode.decoding import DecodeOutput, DecodeSettings, ForwardRecord, OnForward
from harness.decode.loading import LoadedModel
from harness.placement.steps import StepInfo


class _CanvasAnnouncer:
    """Pre-hooks on the encoder and the decoder that number the forwards and announce them."""

    def __init__(self, hook: OnForward | None, prompt: int, first_global_step: int) -> None:
        self.hook, self.prompt, self.global_step = hook, prompt, first_global_step
        self.records: list[ForwardRecord] = []
        self.encoded = 0  # tokens in the KV cache
        self.canvas = -1  # the canvas being denoised
        self.steps = 0  # denoising forwards of that canvas
        self.denoising = False

    def encoder(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        n = int(kwargs.get("input_ids", args[0] if args else None).shape[1])
        if self.canvas < 0:
            info = StepInfo(self.prompt, 0, 0, self.global_step, True, "prefill")
        else:
            info = StepInfo(self.prompt, self.canvas, self.steps, self.global_step, self.canvas == 0, "commit")
        self.denoising = False
        self._announce(info, n, self.encoded + n)
        self.encoded += n

    def decoder(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        n = int(kwargs.get("decoder_input_ids", args[0] if args else None).shape[1])
        if not self.denoising:  # the first step of a new canvas
            self.canvas, self.steps, self.denoising = self.canvas + 1, 0, True
        info = StepInfo(self.prompt, self.canvas, self.steps, self.global_step, self.canvas == 0, "denoise")
        self.steps += 1
        self._announce(info, n, self.encoded + n)

    def _announce(self, info: StepInfo, n_tokens: int, n_context: int) -> None:
        if self.hook is not None:
            self.hook(info, n_tokens, n_context)
        self.global_step += 1
        self.records.append(ForwardRecord(self.prompt, info.block, info.step, info.kind, n_tokens, 0))


def diffusiongemma_generate(
    model: nn.Module,
    prompt_ids: list[int],
    gen_length: int,
    canvas_length: int,
    steps: int,
    seed: int,
    eos_ids: list[int] | int | None,
    on_forward: OnForward | None = None,
    prompt_index: int = 0,
    first_global_step: int = 0,
) -> DecodeOutput:
    """Decode one prompt (module docstring). The sampler draws from torch's global
    generator, seeded here inside a forked RNG state so the caller's stays untouched.
    `generated` holds gen_length tokens (pad after EOS, as DiffusionGemma's generate pads)."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    if gen_length <= 0 or canvas_length <= 0 or steps <= 0:
        raise HarnessError(f"gen_length={gen_length}, canvas_length={canvas_length} and steps={steps} must be "
                           "positive")
    if not prompt_ids:
        raise HarnessError("DiffusionGemma needs a non-empty prompt (its encoder reads it)")
    eos = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
    config = DiffusionGemmaGenerationConfig(max_new_tokens=gen_length, max_denoising_steps=steps,
                                            eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
    announcer = _CanvasAnnouncer(on_forward, prompt_index, first_global_step)
    inner = model.model
    hooks = [inner.encoder.register_forward_pre_hook(announcer.encoder, with_kwargs=True),
             inner.decoder.register_forward_pre_hook(announcer.decoder, with_kwargs=True)]
    saved_canvas = model.config.canvas_length
    model.config.canvas_length = canvas_length  # only generate reads it; the weights do not depend on it
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    forked = [device.index or 0] if device.type == "cuda" else []  # the sampler draws on the model's device
    try:
        with torch.random.fork_rng(devices=forked), torch.inference_mode():
            torch.manual_seed(seed)
            out = model.generate(input_ids=ids, generation_config=config)
    finally:
        model.config.canvas_length = saved_canvas
        for hook in hooks:
            hook.remove()
    sequences = out.sequences if hasattr(out, "sequences") else out
    generated = sequences[0, len(prompt_ids): len(prompt_ids) + gen_length].tolist()
    first_eos = next((i for i, t in enumerate(generated) if t in eos), None)
    n_generated = first_eos + 1 if first_eos is not None else len(generated)
    return DecodeOutput(list(prompt_ids), generated, n_generated, announcer.records, first_eos is not None)


def diffusiongemma_driver(loaded: LoadedModel, ids: list[int], settings: DecodeSettings, hook: OnForward,
                          prompt: int, first_global_step: int) -> DecodeOutput:
    """One prompt: canvases of decode.block_length tokens, each denoised in at most
    decode.steps steps, decode.gen_length tokens in all, the sampler seeded with decode.seed."""
    return diffusiongemma_generate(loaded.model, ids, settings.gen_length, settings.block_length, settings.steps,
                                   settings.seed, loaded.eos_ids, hook, prompt, first_global_step)
