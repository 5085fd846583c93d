"""A generated trace ready to replay: the shape a model's decode runs (autoregressive, LLaDA2's
blocks, DiffusionGemma's canvases) at the requested sizes, and a calibration held out of the
same generation (so it shares the regime's global popularity and layer maps, as a model's
calibration prompts share its router); docs/routing-regimes.md."""

from __future__ import annotations

from pathlib import Path
from statistics import mean

from harness.placement.trace import RoutingTrace
from harness.routing.generate import Dims, generate
from harness.routing.params import RegimeFile, TraceShape
from harness.traces.holdout import hold_out

BLOCK_MODELS = ("tiny", "mini", "flash")  # LLaDA2's block diffusion
CANVAS_MODELS = ("diffusiongemma",)


def mode_of(model: str) -> str:
    return "block" if model in BLOCK_MODELS else "canvas" if model in CANVAS_MODELS else "ar"


def shape_for(regime: RegimeFile, model: str, requests: int | None = None, prompt: int | None = None,
              gen: int | None = None, block: int | None = None, cache: str | None = None) -> TraceShape:
    """The regime's own shape when it fits the model's decode and nothing is overridden; else
    one of `requests` requests of `prompt` + `gen` tokens, each block taking the regime's mean
    steps per block (its block length without one)."""
    mode, own = mode_of(model), regime.shape
    if own is not None and own.mode == mode and requests is prompt is gen is block is cache is None:
        return own
    same = own is not None and own.mode == mode
    requests = requests or (own.requests if own is not None else 8)
    prompt = prompt if prompt is not None else (round(mean(own.prompt_tokens)) if own is not None else 64)
    gen = gen or (round(mean(own.gen_tokens)) if own is not None else 64)
    block = block or (own.block if own is not None else 32)
    if mode == "ar":
        return TraceShape("ar", [max(1, prompt)] * requests, [gen] * requests, block)
    per_block = max(1, round(mean(s for steps in own.steps for s in steps))) if same and own.steps else block
    probe = TraceShape(mode, [prompt], [gen], block, [[1]])
    steps = [[min(per_block, block)] * probe.blocks_for_tokens(0)] * requests
    return TraceShape(mode, [prompt] * requests, [gen] * requests, block, steps,
                      cache or (own.cache if same else "prefix"))


def with_calibration(shape: TraceShape, n: int) -> TraceShape:
    """The shape with n more requests (the last request's sizes) for calibration."""
    if n <= 0:
        return shape
    last = shape.requests - 1
    return TraceShape(shape.mode, shape.prompt_tokens + [shape.prompt_tokens[last]] * n,
                      shape.gen_tokens + [shape.gen_tokens[last]] * n, shape.block,
                      shape.steps + [shape.steps[last]] * n if shape.steps else [], shape.cache)


def generate_with_calibration(regime: RegimeFile, model: str, config: str | None = None, seed: int = 0,
                              calibration: int = 2, requests: int | None = None, prompt: int | None = None,
                              gen: int | None = None, block: int | None = None, cache: str | None = None,
                              dims: Dims | None = None) -> tuple[RoutingTrace, RoutingTrace | None]:
    """(the workload trace, its calibration: the last `calibration` requests, held out)."""
    dims = dims or Dims.of_model(model, config)
    shape = with_calibration(shape_for(regime, model, requests, prompt, gen, block, cache), calibration)
    trace = generate(regime.regime, shape, dims, seed, regime.name, max(0, calibration))
    if config is not None:
        trace.meta["config"] = str(Path(config).resolve())
    if calibration <= 0:
        return trace, None
    return hold_out(trace, calibration, Path(f"generated:{regime.name}"))
