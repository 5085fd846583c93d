"""Lock-step serving over a recorded trace (docs/dali-and-gem.md): `workload.batch=N`
serves a workload's prompts N at a time, as an expert-parallel server decodes a batch with
iteration-level batching: batch forward t carries the t-th forward of every member request
that still has one, and every MoE layer sees the load summed over those members.

The batched trace is built from a per-prompt recording: batch b holds prompts bN .. bN+N-1
(the last batch may be smaller), and its forward t sums the loads and hints (both are sums
over tokens) of its prompts' forward t, for the prompts that have one. Each request keeps its
own order of forwards:

  autoregressive   a prefill, then one decode forward per token: the batch's prefill is one
                   forward over all its prompts, then each forward carries one token of every
                   request still generating
  block diffusion  (LLaDA2, DiffusionGemma) its prefill, its denoising steps and the commits
                   of its finished blocks, in its own order: at forward t one member may be
                   denoising while another commits a block or has run out of forwards (its
                   blocks took fewer steps); a server that batches at the iteration level
                   runs exactly that, one forward over all of them

A batch forward is named for its members by precedence: a step of a block (denoise or
decode: it emits tokens) if any member takes one, else prefill if any member prefills, else
commit; what is charged (loads, tokens, context) does not depend on the name. Its tokens and
context are the sums of the members': the key/value bytes the attention reads are then
exact, while the attention-score FLOPs are charged as tokens x summed context, more than the
true sum of each request's own (by up to the batch size); attention at these batch sizes is
bound by memory, not FLOPs, on the profiles here.

Per request (`serving_figures`), with every request arriving at time 0 and the batches
served one after another:

  first token   the end of its first forward that emits a token: an autoregressive
                prefill (it yields the first token), a block-diffusion request's first
                denoising step
  tpot          (end of its last forward - its first token) / (its generated tokens - 1).
                Autoregressive: one token per forward, computed as before (the mean latency
                of the decode forwards that carried one of its tokens). Block diffusion:
                the generated tokens are the trace meta's `generated_per_prompt` (decoded
                positions before the first EOS), since a forward unmasks several or none
  e2e latency   the modeled time from the start of serving to its last forward: the
                batches before its own, then its own batch's forwards up to its last one
  p50/p90/p99   over the requests, numpy's linear interpolation between order statistics
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.common.errors import HarnessError
from harness.model.hints import NEXT_GATE, RESIDUAL
from harness.placement.steps import STEP_KINDS, StepInfo
from harness.placement.trace import RoutingTrace

PERCENTILES = (50, 90, 99)
PER_PROMPT_TOKENS = "generated_per_prompt"  # trace meta: each prompt's generated tokens, prompt order


@dataclass(frozen=True)
class Request:
    """One member of a batch, by the batch's forward indices."""

    forwards: int  # its forwards: the batch's forwards 0 .. forwards - 1 carry one of its own
    first_token: int  # its first forward that emits a token
    tokens: int | None  # its generated tokens (None: the trace does not record them)


@dataclass
class ServedBatches:
    """The batched trace and, per batch, its requests (prompt order)."""

    trace: RoutingTrace
    requests: list[list[Request]]

    @property
    def forwards(self) -> list[list[int]]:
        """batch -> each member's forward count."""
        return [[r.forwards for r in members] for members in self.requests]


def prompt_rows(trace: RoutingTrace) -> list[list[int]]:
    """Each prompt's forwards (trace rows, in its own order), in prompt order."""
    rows: dict[int, list[int]] = {}
    for i, step in enumerate(trace.steps):
        rows.setdefault(step.prompt, []).append(i)
    return [rows[p] for p in sorted(rows)]


def is_autoregressive(trace: RoutingTrace, rows: list[int]) -> bool:
    """A prefill, then decode forwards: one token per forward."""
    kinds = [trace.steps[i].kind for i in rows]
    return kinds[0] == "prefill" and all(k == "decode" for k in kinds[1:])


def recorded_tokens(trace: RoutingTrace, n_prompts: int) -> list[int] | None:
    """The meta's per-prompt generated tokens; None when the trace predates them."""
    value = trace.meta.get(PER_PROMPT_TOKENS)
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != n_prompts
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value)):
        raise HarnessError(f"the trace's meta {PER_PROMPT_TOKENS} must list {n_prompts} token counts (one per "
                           "prompt) but is malformed; record the trace again")
    return value


def lacks_request_tokens(trace: RoutingTrace) -> bool:
    """Per-request figures need token counts this trace does not record: a prompt that is
    not autoregressive (its forwards do not yield one token each) and no meta list."""
    if PER_PROMPT_TOKENS in trace.meta:
        return False
    return any(not is_autoregressive(trace, rows) for rows in prompt_rows(trace))


def request_of(trace: RoutingTrace, rows: list[int], tokens: int | None) -> Request:
    if is_autoregressive(trace, rows):  # the prefill yields the first token, each decode one more
        return Request(len(rows), 0, len(rows))
    emits = [t for t, i in enumerate(rows) if trace.steps[i].in_block]
    return Request(len(rows), emits[0] if emits else len(rows) - 1, tokens)


def lockstep(trace: RoutingTrace, batch: int) -> ServedBatches:
    """The batched trace of `trace` with `batch` requests per batch (module docstring)."""
    if batch < 1:
        raise HarnessError(f"workload.batch={batch} must be at least 1")
    prompts = prompt_rows(trace)
    counts = recorded_tokens(trace, len(prompts))
    requests = [request_of(trace, rows, counts[p] if counts else None) for p, rows in enumerate(prompts)]
    merged = RoutingTrace(trace.n_layers, trace.n_experts, geometry=dict(trace.geometry),
                          meta={**trace.meta, "batch": batch})
    loads = trace.loads.numpy()
    for b, first in enumerate(range(0, len(prompts), batch)):
        members = prompts[first:first + batch]
        for t in range(max(len(rows) for rows in members)):
            rows = [m[t] for m in members if t < len(m)]
            base = trace.steps[named_member(trace, rows)]
            merged.add_step(StepInfo(b, base.block, base.step, len(merged), base.is_first_block, base.kind),
                            sum(trace.n_tokens[r] for r in rows), sum(trace.n_context[r] for r in rows))
            merged.set_step(len(merged) - 1, loads[rows].sum(0), summed_hints(trace, rows),
                            summed_hints(trace, rows, RESIDUAL))
    batches = [requests[first:first + batch] for first in range(0, len(prompts), batch)]
    return ServedBatches(merged, batches)


def named_member(trace: RoutingTrace, rows: list[int]) -> int:
    """The row a batch forward takes its name from (module docstring): the first member
    taking a step of a block, else the first prefilling, else the first."""
    for wanted in (STEP_KINDS, ("prefill",)):
        for r in rows:
            if trace.steps[r].kind in wanted:
                return r
    return rows[0]


def summed_hints(trace: RoutingTrace, rows: list[int], channel: str = NEXT_GATE) -> np.ndarray | None:
    """The rows' hints of `channel`, summed (a residual hint keeps each request's own running
    mean: a batched live run's would differ, docs/dali-and-gem.md)."""
    hints = [trace.step_hints(r, channel) for r in rows]
    if all(h is None for h in hints):
        return None
    return sum(h.numpy() for h in hints if h is not None)


def percentiles(name: str, values: list[float]) -> dict[str, float]:
    return {f"{name}_p{q}_s": float(np.percentile(values, q)) for q in PERCENTILES} if values else {}


def request_tpot(own: np.ndarray, ends: np.ndarray, request: Request) -> float | None:
    """Its time per output token (module docstring); None with fewer than two tokens."""
    n, tokens = request.forwards, request.tokens
    if tokens is None:
        raise HarnessError("per-request time per output token needs each request's generated tokens, which this "
                           f"trace does not record (meta {PER_PROMPT_TOKENS}); record it again")
    if tokens < 2:
        return None
    if request.first_token == 0 and tokens == n:  # a token per forward (autoregressive): the same quotient,
        return float(np.mean(own[1:n]))           # summed as it always was, so AR figures keep their bits
    return float(ends[n - 1] - ends[request.first_token]) / (tokens - 1)


def serving_figures(latencies: list[float], batches: list[list[Request]]) -> dict[str, float]:
    """Per-request TPOT and end-to-end latency percentiles; `latencies` are the batched
    trace's forwards' modeled seconds, batch after batch."""
    tpot, e2e = [], []
    start = 0.0
    at = 0
    for members in batches:
        length = max(r.forwards for r in members)
        own = np.asarray(latencies[at:at + length], dtype=np.float64)
        ends = np.cumsum(own)
        for request in members:
            per_token = request_tpot(own, ends, request)
            if per_token is not None:
                tpot.append(per_token)
            e2e.append(start + float(ends[request.forwards - 1]))
        start += float(ends[-1])
        at += length
    return {"serving_batches": len(batches), **percentiles("tpot", tpot), **percentiles("e2e_latency", e2e),
            **({"e2e_latency_mean_s": float(np.mean(e2e))} if e2e else {})}
