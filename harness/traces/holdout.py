"""A trace's last requests held out for calibration (`calibration.from_workload=N` with an
explicit trace.path, docs/real-routing.md): the systems that learn (fiddler's popularity,
TIDE's tau*, GEM's mapping, ...) learn from requests the replay never replays, as they do
from a dataset's held-out prompts with a cached trace (harness/job/artifacts.py).

Each part is a trace of its own: its requests renumbered 0.., its forwards' global steps
0.., its meta's counts (prompts, generated tokens, per-request tokens, decode and denoise
forwards, requested tokens where they equal the generated ones, request names) recounted
for the requests it holds."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.common.errors import HarnessError
from harness.model.hints import RESIDUAL
from harness.placement.trace import RoutingTrace
from harness.traces.serving import PER_PROMPT_TOKENS


def hold_out(trace: RoutingTrace, n: int, path: Path) -> tuple[RoutingTrace, RoutingTrace]:
    """(the trace without its last n requests, those n requests)."""
    prompts = sorted({s.prompt for s in trace.steps})
    if not 0 < n < len(prompts):
        raise HarnessError(f"calibration.from_workload={n} holds out {n} requests for calibration but trace {path} "
                           f"has {len(prompts)}, and the replay needs at least one: lower calibration.from_workload")
    if not isinstance(trace.meta.get(PER_PROMPT_TOKENS), list):
        raise HarnessError(f"trace {path} records no per-request generated tokens (meta {PER_PROMPT_TOKENS}) to hold "
                           "requests out with; record it again, or use calibration.from_workload=0")
    kept, held = prompts[:-n], prompts[-n:]
    return subset(trace, kept, prompts, "workload"), subset(trace, held, prompts, "calibration")


def subset(trace: RoutingTrace, chosen: list[int], every: list[int], purpose: str) -> RoutingTrace:
    """The forwards of the `chosen` prompts (ids in `every`, the trace's sorted prompt ids)."""
    number = {p: i for i, p in enumerate(chosen)}
    rows = [i for i, s in enumerate(trace.steps) if s.prompt in number]
    out = RoutingTrace(trace.n_layers, trace.n_experts, geometry=dict(trace.geometry),
                       meta=_meta(trace.meta, [every.index(p) for p in chosen], [trace.steps[i] for i in rows],
                                  purpose))
    loads = trace.loads
    for g, i in enumerate(rows):
        out.add_step(replace(trace.steps[i], prompt=number[trace.steps[i].prompt], global_step=g), trace.n_tokens[i],
                     trace.n_context[i])
        hints, residual = trace.step_hints(i), trace.step_hints(i, RESIDUAL)
        out.set_step(g, loads[i].numpy(), None if hints is None else hints.numpy(),
                     None if residual is None else residual.numpy())
    return out


def _meta(meta: dict[str, Any], positions: list[int], steps: list, purpose: str) -> dict[str, Any]:
    out = {**meta, "purpose": purpose, "prompts": len(positions)}
    kinds = Counter(s.kind for s in steps)
    if "decode_steps" in meta:
        out["decode_steps"] = kinds["decode"]
    if "denoise_steps" in meta:
        out["denoise_steps"] = kinds["denoise"]
    tokens = [meta[PER_PROMPT_TOKENS][i] for i in positions]
    out[PER_PROMPT_TOKENS] = tokens
    out["generated_tokens"] = sum(tokens)
    if meta.get("requested_tokens") == meta.get("generated_tokens"):  # an import: what was generated was asked for
        out["requested_tokens"] = sum(tokens)
    else:  # a per-request request count the trace does not record
        out.pop("requested_tokens", None)
    if isinstance(meta.get("requests"), list):
        out["requests"] = [meta["requests"][i] for i in positions]
    return out
