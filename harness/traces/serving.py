"""Lock-step serving over a recorded trace (issue 27; docs/dali-and-gem.md): `workload.batch=N`
serves an autoregressive family's prompts N at a time, as an expert-parallel server decodes a
batch: the batch's prefill is one forward over all its prompts, then each decode forward
carries one token of every request still generating, and every MoE layer sees the load
summed over the batch.

The batched trace is built from a per-prompt recording (prefill, then one decode forward per
token, for each prompt): batch b holds prompts bN .. bN+N-1 (the last batch may be
smaller), and its forward t sums the loads and hints (both are sums over tokens) of its
prompts' forward t, for the prompts that have one. Its tokens and context are the sums of
the members' too: the key/value bytes the attention reads are then exact, while the
attention-score FLOPs are charged as tokens x summed context, more than the true sum of
each request's own (by up to the batch size); decode attention at these batch sizes is
bound by memory, not FLOPs, on the profiles here.

Per request (`serving_figures`), with every request arriving at time 0 and the batches
served one after another:

  tpot          the mean modeled latency of the batch's decode forwards that carried one
                of its tokens (its time per output token after the first)
  e2e latency   the modeled time from the start of serving to its last token: the batches
                before its own, then its own batch's forwards up to its last one
  p50/p90/p99   over the requests, numpy's linear interpolation between order statistics
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.common.errors import HarnessError
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace

PERCENTILES = (50, 90, 99)


@dataclass
class ServedBatches:
    """The batched trace and, per batch, its requests' forward counts (prompt order)."""

    trace: RoutingTrace
    forwards: list[list[int]]  # batch -> each member's forwards (1 prefill + its decode forwards)


def prompt_rows(trace: RoutingTrace) -> list[list[int]]:
    """Each prompt's forwards (trace rows), in prompt order; every prompt must be a prefill
    followed by decode forwards (an autoregressive recording)."""
    rows: dict[int, list[int]] = {}
    for i, step in enumerate(trace.steps):
        rows.setdefault(step.prompt, []).append(i)
    for prompt, mine in rows.items():
        kinds = [trace.steps[i].kind for i in mine]
        if kinds[0] != "prefill" or any(k != "decode" for k in kinds[1:]):
            raise HarnessError(
                f"workload.batch > 1 serves autoregressive recordings (a prefill, then decode forwards); prompt "
                f"{prompt} of this trace has {sorted(set(kinds))} forwards: use an autoregressive family "
                "(model=qwen3_moe|mixtral|olmoe) or workload.batch=1")
    return [rows[p] for p in sorted(rows)]


def lockstep(trace: RoutingTrace, batch: int) -> ServedBatches:
    """The batched trace of `trace` with `batch` requests per batch (module docstring)."""
    if batch < 1:
        raise HarnessError(f"workload.batch={batch} must be at least 1")
    prompts = prompt_rows(trace)
    merged = RoutingTrace(trace.n_layers, trace.n_experts, geometry=dict(trace.geometry),
                          meta={**trace.meta, "batch": batch})
    loads = trace.loads.numpy()
    forwards: list[list[int]] = []
    for b, first in enumerate(range(0, len(prompts), batch)):
        members = prompts[first:first + batch]
        forwards.append([len(rows) for rows in members])
        for t in range(max(len(rows) for rows in members)):
            rows = [m[t] for m in members if t < len(m)]
            base = trace.steps[rows[0]]
            merged.add_step(StepInfo(b, base.block, base.step, len(merged), base.is_first_block, base.kind),
                            sum(trace.n_tokens[r] for r in rows), sum(trace.n_context[r] for r in rows))
            merged.set_step(len(merged) - 1, loads[rows].sum(0), _summed_hints(trace, rows))
    return ServedBatches(merged, forwards)


def _summed_hints(trace: RoutingTrace, rows: list[int]) -> np.ndarray | None:
    hints = [trace.step_hints(r) for r in rows]
    if all(h is None for h in hints):
        return None
    return sum(h.numpy() for h in hints if h is not None)


def percentiles(name: str, values: list[float]) -> dict[str, float]:
    return {f"{name}_p{q}_s": float(np.percentile(values, q)) for q in PERCENTILES} if values else {}


def serving_figures(latencies: list[float], forwards: list[list[int]]) -> dict[str, float]:
    """Per-request TPOT and end-to-end latency percentiles; `latencies` are the batched
    trace's forwards' modeled seconds, batch after batch."""
    tpot, e2e = [], []
    start = 0.0
    at = 0
    for members in forwards:
        own = latencies[at:at + max(members)]
        ends = np.cumsum(own)
        for n in members:
            if n > 1:
                tpot.append(float(np.mean(own[1:n])))
            e2e.append(start + float(ends[n - 1]))
        start += float(ends[-1])
        at += max(members)
    return {"serving_batches": len(forwards), **percentiles("tpot", tpot), **percentiles("e2e_latency", e2e),
            **({"e2e_latency_mean_s": float(np.mean(e2e))} if e2e else {})}
