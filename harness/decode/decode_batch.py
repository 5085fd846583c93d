"""Decoding a batch of prompts, one prompt at a time (batch 1, as in the offloading papers),
with an engine (or the hybrid executor that wraps it) on the model's MoE layers. Live
runs, the cached calibration and workload traces (harness/job/artifacts.py) and the
all-GPU reference all decode through here.

Each kind of model decodes with its own loop, and every loop announces each forward to
the same hook (StepInfo): LLaDA2 with the common block-diffusion loop (decoding.py), an
autoregressive transformers family greedily through its own `generate` (ar_generate.py;
its "block" is a window of decode.block_length decode steps), DiffusionGemma through its
own `generate` and sampler (diffusiongemma_generate.py; a canvas of decode.block_length
tokens denoised in at most decode.steps steps)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm import tqdm

from harness.common.errors import HarnessError
from harness.decode.ar_generate import ar_generate
from harness.decode.decoding import DecodeOutput, DecodeSettings, OnForward, decode
from harness.decode.diffusiongemma_generate import diffusiongemma_generate
from harness.decode.loading import LoadedModel
from harness.decode.workload import check_prompt_lengths, encode_prompt
from harness.engine.engine import OffloadEngine
from harness.families.bridge import attach, detach
from harness.hybrid.executor import HybridExecutor, wrap
from harness.model import KVCache
from harness.placement.steps import StepInfo


@dataclass
class DecodeBatch:
    outputs: list[DecodeOutput]
    wall_s: float
    requested_tokens: int = 0  # each prompt's gen_length (after decode.gen_length_bucket), summed

    @property
    def generated_tokens(self) -> int:
        return sum(o.n_generated for o in self.outputs)

    @property
    def denoise_steps(self) -> int:
        return sum(1 for o in self.outputs for r in o.records if r.kind == "denoise")

    @property
    def decode_steps(self) -> int:
        """Autoregressive decode forwards (one token each)."""
        return sum(1 for o in self.outputs for r in o.records if r.kind == "decode")

    @property
    def forwards(self) -> int:
        return sum(len(o.records) for o in self.outputs)

    @property
    def routed_tokens(self) -> int:
        return sum(r.tokens_routed for o in self.outputs for r in o.records)


def decode_prompts(
    loaded: LoadedModel,
    prompts: list[str],
    settings: DecodeSettings,
    on_forward: OnForward | None = None,
    desc: str = "decode",
) -> DecodeBatch:
    """Decode prompts one at a time (batch 1, as in the offloading papers)."""
    outputs: list[DecodeOutput] = []
    global_step = 0
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", mininterval=0.5, leave=False, dynamic_ncols=True)

    def hook(step: StepInfo, n_tokens: int, n_context: int) -> None:
        if step.in_block and step.step == 0:
            bar.set_postfix_str(f"block {step.block}", refresh=False)
        if on_forward is not None:
            on_forward(step, n_tokens, n_context)

    encoded = encode_checked(loaded, prompts, settings, desc)
    start = time.perf_counter()
    for i, ids in enumerate(encoded):
        out = decode_one(loaded, ids, settings, hook, i, global_step)
        global_step += len(out.records)
        outputs.append(out)
        bar.update(1)
    bar.close()
    requested = sum(settings.for_prompt(len(ids)).gen_length for ids in encoded)
    return DecodeBatch(outputs, time.perf_counter() - start, requested)


def decode_one(loaded: LoadedModel, ids: list[int], settings: DecodeSettings, hook: OnForward, prompt: int,
               first_global_step: int) -> DecodeOutput:
    """One prompt with the loop of the model's kind (module docstring)."""
    if loaded.kind == "ar":
        return ar_generate(loaded.model, ids, settings.gen_length, loaded.eos_ids[0], hook,
                           window=settings.block_length, prompt_index=prompt, first_global_step=first_global_step)
    if loaded.kind == "diffusion":
        return diffusiongemma_generate(loaded.model, ids, settings.gen_length, settings.block_length,
                                       settings.steps, settings.seed, loaded.eos_ids, hook, prompt, first_global_step)
    cfg = loaded.model.config
    mine = settings.for_prompt(len(ids))  # gen_length trimmed to the prompt's bucket, if any
    return decode(loaded.model, ids, mine, cfg.mask_token_id, cfg.eos_token_id, new_cache=KVCache, on_forward=hook,
                  prompt_index=prompt, first_global_step=first_global_step)


def encode_checked(loaded: LoadedModel, prompts: list[str], settings: DecodeSettings, what: str) -> list[list[int]]:
    """Token ids of every prompt, each checked to fit the model's positions before any decoding."""
    encoded = [encode_prompt(loaded.tokenizer, text) for text in prompts]
    check_prompt_lengths(encoded, settings.gen_length, settings.block_length, loaded.max_positions, what)
    return encoded


class EngineHook:
    """Connects the decoding loop's per-forward hook to the engine."""

    def __init__(self, engine: OffloadEngine) -> None:
        self.engine = engine

    def __call__(self, step: StepInfo, n_tokens: int, n_context: int) -> None:
        self.engine.begin_step(step, n_tokens, n_context)  # also closes the previous step

    def close(self) -> None:
        self.engine.end_step()


def decode_with_engine(loaded: LoadedModel, engine: OffloadEngine | HybridExecutor, prompts: list[str],
                       settings: DecodeSettings, desc: str) -> DecodeBatch:
    if loaded.kind != "llada2":
        return decode_family_with_engine(loaded, engine, prompts, settings, desc)
    runner = wrap(loaded.model, engine)  # a HybridExecutor when the model is on a device (backend=cuda|standin)
    hook = EngineHook(runner)
    previous = loaded.model.engine
    loaded.model.engine = runner
    try:
        return decode_prompts(loaded, prompts, settings, on_forward=hook, desc=desc)
    finally:
        hook.close()
        loaded.model.engine = previous
        if runner is not engine:  # made here (calibration, reference): free its device slots
            runner.close()


def decode_family_with_engine(loaded: LoadedModel, engine: OffloadEngine | HybridExecutor, prompts: list[str],
                              settings: DecodeSettings, desc: str) -> DecodeBatch:
    """A transformers family: the bridge hands every MoE layer's routing to the engine
    (OffloadEngine.route) and the model's own eager experts compute it, so every placement
    gives the stock model's bits. Host only: the device executor serves LLaDA2's layers."""
    if not isinstance(engine, OffloadEngine):
        raise HarnessError("backend=cuda|standin executes LLaDA2 models only; a transformers family runs with "
                           "backend=cpu (modeled timing)")
    hook = EngineHook(engine)
    attach(loaded.model, engine)
    try:
        return decode_prompts(loaded, prompts, settings, on_forward=hook, desc=desc)
    finally:
        hook.close()
        detach(loaded.model)
