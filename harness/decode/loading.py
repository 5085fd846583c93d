"""A configured model, loaded and ready to decode, whatever its kind: its weights, tokenizer
and nominal geometry, and the two things its kind's entry (harness/zoo) hands the decode
loop: the driver that decodes one prompt, and how an engine joins the model's MoE layers.

The loop (decode_batch.py) calls only these, so it never asks which kind of model it runs;
the entries load models (harness/zoo/entry.py `load_model`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from harness.decode.decoding import DecodeOutput, DecodeSettings, OnForward
from harness.engine.engine import OffloadEngine
from harness.hybrid.executor import HybridExecutor
from harness.placement.system import MoEGeometry

Runner = OffloadEngine | HybridExecutor  # what the model's MoE layers call: the engine, or a device executor


class DecodeDriver(Protocol):
    """Decodes one prompt (token ids) with the model's own loop, announcing every forward to
    `hook` before it runs (StepInfo numbered from `first_global_step`)."""

    def __call__(self, loaded: LoadedModel, ids: list[int], settings: DecodeSettings, hook: OnForward,
                 prompt: int, first_global_step: int) -> DecodeOutput: ...


# (model, engine or executor) -> a context in which the model's MoE layers call the runner it yields
AttachEngine = Callable[[nn.Module, Runner], AbstractContextManager[Runner]]


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any
    weights: str  # "real" | "trained-proxy" | "random-proxy"
    path: Path
    nominal: MoEGeometry  # the geometry the budget and the cost model charge
    eos_ids: list[int]  # the token ids that end a generation
    max_positions: int  # the longest prompt + generation the loaded model's positions cover
    driver: DecodeDriver  # its kind's decode loop (the entry's)
    attach_engine: AttachEngine  # how an engine serves its MoE layers (the entry's)


def eos_list(eos: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """A config's eos_token_id (one id, a list, or none) as a list of ids."""
    return [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]) if e is not None]
