"""Decoding a batch of prompts with the common loop, one prompt at a time (batch 1, as in
the offloading papers), and with an engine (or the hybrid executor that wraps it) on the
model's MoE layers. Live runs, the cached calibration and workload traces
(harness/job/artifacts.py) and the all-GPU reference all decode through here."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm import tqdm

from harness.decode.decoding import DecodeOutput, DecodeSettings, OnForward, decode
from harness.decode.loading import LoadedModel
from harness.decode.workload import check_prompt_lengths, encode_prompt
from harness.engine.engine import OffloadEngine
from harness.hybrid.executor import HybridExecutor, wrap
from harness.model import KVCache
from harness.placement.steps import StepInfo


@dataclass
class DecodeBatch:
    outputs: list[DecodeOutput]
    wall_s: float

    @property
    def generated_tokens(self) -> int:
        return sum(o.n_generated for o in self.outputs)

    @property
    def denoise_steps(self) -> int:
        return sum(1 for o in self.outputs for r in o.records if r.kind == "denoise")

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
    cfg = loaded.model.config
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
        out = decode(
            loaded.model, ids, settings, cfg.mask_token_id, cfg.eos_token_id,
            new_cache=KVCache, on_forward=hook, prompt_index=i, first_global_step=global_step,
        )
        global_step += len(out.records)
        outputs.append(out)
        bar.update(1)
    bar.close()
    return DecodeBatch(outputs, time.perf_counter() - start)


def encode_checked(loaded: LoadedModel, prompts: list[str], settings: DecodeSettings, what: str) -> list[list[int]]:
    """Token ids of every prompt, each checked to fit the model's positions before any decoding."""
    encoded = [encode_prompt(loaded.tokenizer, text) for text in prompts]
    check_prompt_lengths(encoded, settings.gen_length, settings.block_length,
                         loaded.model.config.max_position_embeddings, what)
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
