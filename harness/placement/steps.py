"""The identity of one model forward, as every layer of the harness sees it: the decoding loop
announces it, the engine and the ledger charge it, traces record it and systems read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ForwardKind = Literal["prefill", "denoise", "commit", "decode"]
# the kinds that are one step of a block: a denoising step of a diffusion block, or one
# token of an autoregressive model, whose "block" is a window of decode steps
STEP_KINDS = ("denoise", "decode")


@dataclass(frozen=True)
class StepInfo:
    """One model forward of the decoding loop.

    kind: 'prefill' (the prompt's whole blocks, once per prompt, prefix cache only; an
    autoregressive model's prompt; DiffusionGemma's encoder over the prompt), 'denoise'
    (one denoising step of the current block or canvas), 'commit' (one forward of a
    finished block to cache its keys and values) or 'decode' (one token of an
    autoregressive model: block = token // window, step = token % window).
    step: step within the block (0-based) for 'denoise'; 0 for 'prefill'; the number of
    steps the block took for 'commit'.
    """

    prompt: int
    block: int
    step: int
    global_step: int
    is_first_block: bool
    kind: ForwardKind = "denoise"

    @property
    def in_block(self) -> bool:
        """One step of a block (a denoising step, or an autoregressive token of a window):
        what rules defined over the steps of a block (TIDE's tau) count."""
        return self.kind in STEP_KINDS
