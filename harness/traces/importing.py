"""Routing recorded elsewhere (vLLM, a generic id dump, a logging patch), checked and turned
into the harness's trace format (harness/placement/trace.py), so every system replays it
(docs/real-routing.md).

Each format reader (vllm_format.py, ids_format.py, jsonl_format.py) yields `Request`s: a
request's routed expert ids per token, [tokens, MoE layers, top_k], its prompt rows apart
from its generated rows. A request becomes the forwards an autoregressive decode runs, as
the harness records its own (harness/zoo/ar_generate.py):

  prefill    one forward over the prompt's P tokens (it yields the first generated token):
             loads = the prompt rows' expert counts; tokens P, context P
  decode d   one forward per further generated token, fed back (d = 0 .. G-2): loads = the
             generated row d's top-k experts; tokens 1, context P + d + 1; block d // window,
             step d % window (TIDE's "block" is a window of decode steps)

G generated tokens make G - 1 decode forwards: the last generated token is never fed back,
and vLLM returns no routing for it (its arrays hold num_tokens - 1 rows). A file that holds
a row for it too (G generated rows) has that row dropped, and the trace meta counts it.
A request without a prompt split (ids and jsonl formats) is replayed as one decode forward
per row, no prefill.

Requests are kept apart (the single-request systems replay them one after another) in
arrival order; `workload.batch=N` serves them N at a time in lock-step
(harness/traces/serving.py). What a format cannot give is marked absent in the trace meta
(`absent`): token texts always; next-layer hints unless `hints=next` fills each forward's
hint for layer l with layer l + 1's true load (a perfect predictor; docs/real-routing.md
says which stand-in each system uses).

Bad input is one line naming the request and the position: wrong shapes, ids outside
0..E-1, an expert listed twice for one token, a layer count or top-k other than the
model's, prompt or generated rows missing (dropped tokens), the same request twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.common.errors import HarnessError
from harness.placement.steps import StepInfo
from harness.placement.system import MoEGeometry
from harness.placement.trace import RoutingTrace
from harness.traces.serving import PER_PROMPT_TOKENS
from harness.zoo.entry import ModelConfig, model_entry, nominal_geometry

HINTS = ("none", "next")
ABSENT_ALWAYS = ("token_texts",)
DEFAULT_WINDOW = 32  # decode.block_length's default: the window a harness recording uses


@dataclass
class Request:
    """One request's routing as a format gives it (ids: int arrays [rows, layers, top_k])."""

    name: str  # how messages name it: "responses.jsonl:3 response cmpl-1 choice 0"
    prompt: np.ndarray | None  # the prompt's rows, or None: no prompt split (decode forwards only)
    generated: np.ndarray  # the generated tokens' rows, fed back one per decode forward
    generated_tokens: int | None  # G when the format says it (None: rows + 1, or rows without a prompt)
    prompt_tokens: int | None = None  # P when the format says it (None: the prompt rows)
    arrival: float = 0.0  # the order requests arrived in (stable for equal values)
    weights: list[np.ndarray] = field(default_factory=list)  # gate weights, checked, not replayed


@dataclass
class Imported:
    """What a reader found: the requests, and how the source is described in the meta."""

    requests: list[Request]
    source: dict[str, Any]  # format, path, files, layout, ...


def model_geometry(model: str, config: str | None) -> tuple[MoEGeometry, ModelConfig]:
    """The nominal geometry of `model=` (any registered model; `hf` with config=<config.json>)."""
    entry = model_entry(model)
    node = next(n for n in entry.models if n.name == model)
    cfg = ModelConfig(name=model, nominal=node.nominal, path=config)
    return nominal_geometry(cfg), cfg


def as_ids(value: Any, what: str) -> np.ndarray:
    """An int64 [rows, layers, top_k] array of expert ids, or a one-line error naming `what`."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        array = None
    if array is None or array.dtype == object or array.ndim != 3 or array.dtype.kind not in "iu":
        shape = "ragged" if array is None or array.dtype == object else f"{array.dtype} {array.shape}"
        raise HarnessError(f"{what} is not a [tokens, MoE layers, top_k] array of integer expert ids ({shape}); "
                           "give the routed expert ids as the server returned them")
    return array.astype(np.int64)


def check_ids(ids: np.ndarray, request: str, part: str, geometry: MoEGeometry, first_token: int = 0) -> None:
    """Shape against the model, ids in 0..E-1, no expert twice within one token's top-k."""
    layers, top_k, experts = geometry.n_moe_layers, geometry.num_experts_per_tok, geometry.num_experts
    if ids.shape[1] != layers:
        raise HarnessError(f"{request}: the {part} rows hold {ids.shape[1]} MoE layers per token but the model's "
                           f"config has {layers}: the layer count does not match; import it with the model it was "
                           "recorded on")
    if ids.shape[2] != top_k:
        raise HarnessError(f"{request}: the {part} rows list {ids.shape[2]} experts per token and layer but the model "
                           f"routes top-{top_k}; import it with the model it was recorded on")
    bad = np.argwhere((ids < 0) | (ids >= experts))
    if bad.size:
        t, layer, j = (int(v) for v in bad[0])
        raise HarnessError(f"{request}: token {first_token + t} ({part}) layer {layer} routes to expert "
                           f"{int(ids[t, layer, j])}, outside 0..{experts - 1} of the model's {experts} experts")
    if top_k > 1 and ids.size:
        ordered = np.sort(ids, axis=2)
        twice = np.argwhere(ordered[:, :, 1:] == ordered[:, :, :-1])
        if twice.size:
            t, layer, j = (int(v) for v in twice[0])
            raise HarnessError(f"{request}: token {first_token + t} ({part}) layer {layer} lists expert "
                               f"{int(ordered[t, layer, j])} twice in its top-{top_k}; a token routes to distinct "
                               "experts (a corrupt or mis-assembled file)")


def check_weights(weights: np.ndarray, ids: np.ndarray, request: str, part: str) -> None:
    if weights.shape != ids.shape or weights.dtype.kind != "f" or not np.isfinite(weights).all() \
            or (weights < 0).any():
        raise HarnessError(f"{request}: the {part} gate weights must be finite, non-negative floats shaped like its "
                           f"ids {ids.shape} (got {weights.dtype} {weights.shape})")


@dataclass
class Forwards:
    """A request checked and cut into its forwards."""

    name: str
    prompt: np.ndarray | None  # the prefill's rows (None: no prefill)
    decode: np.ndarray  # one row per decode forward
    generated_tokens: int
    dropped_last: bool  # a row for the last generated token was dropped (module docstring)


def checked(request: Request, geometry: MoEGeometry) -> Forwards:
    """The request's forwards; a mismatch between rows and token counts is a one-line error."""
    name = request.name
    prompt = request.prompt
    if prompt is not None:
        check_ids(prompt, name, "prompt", geometry)
        p = request.prompt_tokens if request.prompt_tokens is not None else len(prompt)
        if len(prompt) != p:
            raise HarnessError(f"{name}: the prompt has {p} tokens but its routing holds {len(prompt)} rows: "
                               f"{'prompt tokens were dropped' if len(prompt) < p else 'rows beyond the prompt'} "
                               "(vLLM: send requests with routed_experts_prompt_start=0)")
        if p == 0:
            raise HarnessError(f"{name}: an empty prompt has nothing to prefill; drop the request")
    first = len(prompt) if prompt is not None else 0
    check_ids(request.generated, name, "generated", geometry, first)
    parts = [(prompt, "prompt")] if prompt is not None else []
    for w, (ids, part) in zip(request.weights, [*parts, (request.generated, "generated")], strict=False):
        check_weights(w, ids, name, part)
    rows = len(request.generated)
    if prompt is None:  # decode forwards only: each row one forward, each forward one token
        g = request.generated_tokens if request.generated_tokens is not None else rows
        if rows != g:
            raise HarnessError(f"{name}: {g} generated tokens but {rows} routing rows: tokens were dropped or added")
        if rows == 0:
            raise HarnessError(f"{name} holds no routing rows; drop the request")
        return Forwards(name, None, request.generated, g, False)
    g = request.generated_tokens if request.generated_tokens is not None else rows + 1
    if g < 1:
        raise HarnessError(f"{name} generated no tokens: nothing was decoded; drop the request")
    if rows not in (g - 1, g):
        raise HarnessError(f"{name}: {g} generated tokens need {g - 1} routing rows (every token but the last is fed "
                           f"back) but the file holds {rows}: generated tokens were "
                           f"{'dropped' if rows < g - 1 else 'duplicated or added'}")
    return Forwards(name, prompt, request.generated[:g - 1], g, rows == g)


def counts(ids: np.ndarray, n_experts: int) -> np.ndarray:
    """int32 [layers, E]: how many of the rows route to each expert, per layer."""
    layers = ids.shape[1]
    offsets = (np.arange(layers) * n_experts)[None, :, None]
    flat = np.bincount((ids + offsets).reshape(-1), minlength=layers * n_experts)
    return flat.reshape(layers, n_experts).astype(np.int32)


def one_hot(ids: np.ndarray, n_experts: int) -> np.ndarray:
    """int32 [rows, layers, E]: each row's own top-k (distinct, checked) as loads of one."""
    rows, layers, _ = ids.shape
    out = np.zeros((rows, layers, n_experts), dtype=np.int32)
    r = np.arange(rows)[:, None, None]
    la = np.arange(layers)[None, :, None]
    out[r, la, ids] = 1
    return out


def build_trace(imported: Imported, geometry: MoEGeometry, model: ModelConfig, window: int = DEFAULT_WINDOW,
                hints: str = "none", weights: str = "real") -> RoutingTrace:
    """The trace of the module docstring, requests in arrival order."""
    if window < 1:
        raise HarnessError(f"window={window} must be a positive number of decode steps")
    if hints not in HINTS:
        raise HarnessError(f"hints={hints!r} is not allowed; use none (no predictor) or next (the true next-layer "
                           "load)")
    if not imported.requests:
        raise HarnessError(f"{imported.source.get('path')} holds no request with routing; nothing to import")
    order = sorted(range(len(imported.requests)), key=lambda i: imported.requests[i].arrival)  # stable
    requests = [checked(imported.requests[i], geometry) for i in order]
    layers, experts = geometry.n_moe_layers, geometry.num_experts
    steps: list[tuple[StepInfo, int, int]] = []
    blocks: list[np.ndarray] = []
    for p, req in enumerate(requests):
        context = 0
        if req.prompt is not None:
            context = len(req.prompt)
            steps.append((StepInfo(p, 0, 0, len(steps), True, "prefill"), context, context))
            blocks.append(counts(req.prompt, experts)[None])
        for d in range(len(req.decode)):
            block = d // window
            context += 1
            steps.append((StepInfo(p, block, d % window, len(steps), block == 0, "decode"), 1, context))
        blocks.append(one_hot(req.decode, experts))
    loads = np.concatenate(blocks)
    hint_rows = _next_layer_hints(loads) if hints == "next" else None
    trace = RoutingTrace(layers, experts, geometry=geometry.to_dict())
    for s, (info, tokens, context) in enumerate(steps):  # each forward's loads a view of one array
        trace.add_step(info, tokens, context)
        trace.set_step(s, loads[s], None if hint_rows is None else hint_rows[s])
    trace._stacked = torch.from_numpy(loads)
    generated = [r.generated_tokens for r in requests]
    trace.meta = {
        "purpose": "workload", "routing": "imported", "imported_from": imported.source, "model": model.name,
        **({"config": str(Path(model.path).resolve())} if model.path else {}),
        "weights": weights, "checkpoint": f"imported:{imported.source.get('path')}",
        "requests": [r.name for r in requests],
        "absent": [*ABSENT_ALWAYS, *([] if hints == "next" else ["hints"])],
        "hints": "next_layer_loads" if hints == "next" else "none",
        "prompts": len(requests), "generated_tokens": sum(generated), "requested_tokens": sum(generated),
        "denoise_steps": 0, "decode_steps": int(sum(len(r.decode) for r in requests)),
        PER_PROMPT_TOKENS: generated, "dropped_last_rows": sum(r.dropped_last for r in requests),
        "decode": {"block_length": window, "steps": window},
    }
    return trace


def _next_layer_hints(loads: np.ndarray) -> np.ndarray:
    """float32 [S, L, E]: row l is layer l + 1's true load (the last layer predicts nothing)."""
    hints = np.zeros(loads.shape, dtype=np.float32)
    hints[:, :-1] = loads[:, 1:]
    return hints
