"""Decoding a batch of prompts, one prompt at a time (batch 1, as in the offloading papers),
with an engine (or the hybrid executor that wraps it) on the model's MoE layers. Live
runs, the cached calibration and workload traces (harness/job/artifacts.py) and the
all-GPU reference all decode through here.

Each kind of model decodes with its own loop, its entry's driver (harness/zoo), and every
loop announces each forward to the same hook (StepInfo): LLaDA2 with the common
block-diffusion loop (decoding.py), an autoregressive transformers family greedily through
its own `generate` (harness/zoo/ar_generate.py; its "block" is a window of
decode.block_length decode steps), DiffusionGemma through its own `generate` and sampler
(harness/zoo/diffusiongemma_generate.py; a canvas of decode.block_length tokens denoised in
at most decode.steps steps). How the engine joins the model's MoE layers is its entry's
too (`LoadedModel.attach_engine`)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from tqdm import tqdm

from harness.decode.decoding import DecodeOutput, DecodeSettings, OnForward
from harness.decode.loading import LoadedModel, Runner
from harness.decode.workload import check_prompt_lengths, encode_prompt
from harness.placement.steps import StepInfo


@dataclass
class DecodeBatch:
    outputs: list[DecodeOutput]
    wall_s: float
    requested_tokens: int = 0  # each prompt's gen_length (after decode.gen_length_bucket), summed

    @property
    def generated_tokens(self) -> int:
        return sum(o.n_generated for o in self.outputs)

    def forwards_of_kind(self) -> Counter[str]:
        """How many forwards of each kind (prefill, denoise, commit, decode) the batch ran."""
        return Counter(r.kind for o in self.outputs for r in o.records)

    @property
    def denoise_steps(self) -> int:
        return self.forwards_of_kind()["denoise"]

    @property
    def decode_steps(self) -> int:
        """Autoregressive decode forwards (one token each)."""
        return self.forwards_of_kind()["decode"]

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
    """One prompt with the loop of the model's kind (its entry's driver)."""
    return loaded.driver(loaded, ids, settings, hook, prompt, first_global_step)


def encode_checked(loaded: LoadedModel, prompts: list[str], settings: DecodeSettings, what: str) -> list[list[int]]:
    """Token ids of every prompt, each checked to fit the model's positions before any decoding."""
    encoded = [encode_prompt(loaded.tokenizer, text) for text in prompts]
    check_prompt_lengths(encoded, settings.gen_length, settings.block_length, loaded.max_positions, what)
    return encoded


class EngineHook:
    """Connects the decoding loop's per-forward hook to the engine."""

    def __init__(self, engine: Runner) -> None:
        self.engine = engine

    def __call__(self, step: StepInfo, n_tokens: int, n_context: int) -> None:
        self.engine.begin_step(step, n_tokens, n_context)  # also closes the previous step

    def close(self) -> None:
        self.engine.end_step()


def decode_with_engine(loaded: LoadedModel, engine: Runner, prompts: list[str], settings: DecodeSettings,
                       desc: str) -> DecodeBatch:
    """Decode the prompts with the engine (or the device executor around it) serving every
    MoE layer, joined to the model as the model's entry says (`LoadedModel.attach_engine`)."""
    with loaded.attach_engine(loaded.model, engine) as runner:
        hook = EngineHook(runner)
        try:
            return decode_prompts(loaded, prompts, settings, on_forward=hook, desc=desc)
        finally:
            hook.close()
