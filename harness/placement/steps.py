"""The identity of one model forward, as every layer of the harness sees it: the decoding loop
announces it, the engine and the ledger charge it, traces record it and systems read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ForwardKind = Literal["prefill", "denoise", "commit"]


@dataclass(frozen=True)
class StepInfo:
    """One model forward of the decoding loop.

    kind: 'prefill' (the prompt's whole blocks, once per prompt, prefix cache only),
    'denoise' (one denoising step of the current block) or 'commit' (one forward of a
    finished block to cache its keys and values, prefix cache only).
    step: step within the block (0-based) for 'denoise'; 0 for 'prefill'; the number of
    steps the block took for 'commit'.
    """

    prompt: int
    block: int
    step: int
    global_step: int
    is_first_block: bool
    kind: ForwardKind = "denoise"
