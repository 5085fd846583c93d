"""Serving with request arrivals and continuous batching (docs/traces-and-experiments.md,
"Serving"): `workload.arrivals=poisson` gives each request of a recorded trace an arrival
time (a seeded Poisson process of `workload.arrival_rate` requests per modeled second, in
prompt order; `workload.arrivals=trace` reads them from a file: harness/traces/arrival_times.py),
and the server batches at the iteration level as vLLM does:

  at each batch forward, the requests that have arrived by the modeled clock join, first
  come first served, while fewer than `workload.batch` are running; the forward carries the
  next forward of every running request (loads, hints, tokens and context summed, named by
  precedence, as lock-step serving does: harness/traces/serving.py); a request whose last
  forward it was leaves. With nothing running and nothing arrived, the clock jumps to the
  next arrival.

When a request joins depends on how long the forwards before took, which depends on the
system being replayed, so the schedule is built inside the replay: `continuous` asks
`forward(trace, s)` for the modeled seconds of batch forward s as soon as it is built.

Per request: queueing delay (arrival to its first forward's start), time to first token
(arrival to the end of its first forward that emits a token), time per output token (as
lock-step serving defines it) and end-to-end latency (arrival to the end of its last
forward). `workload.arrivals=static` keeps lock-step batches, every request at time 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import torch

from harness.common.errors import HarnessError
from harness.engine.engine import OffloadEngine
from harness.model.hints import RESIDUAL
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.traces.serving import (
    Request,
    named_member,
    percentiles,
    prompt_rows,
    recorded_tokens,
    request_of,
    request_tpot,
    summed_hints,
)

ARRIVALS = ("static", "poisson", "trace")  # trace: harness/traces/arrival_times.py


def check_arrivals(kind: str, rate: float | None) -> None:
    """One-line errors for a bad arrival process."""
    if kind not in ARRIVALS:
        raise HarnessError(f"workload.arrivals={kind!r} is not one of {', '.join(ARRIVALS)}")
    if kind == "poisson":
        if rate is None:
            raise HarnessError("workload.arrivals=poisson needs workload.arrival_rate=<requests per second>")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0 or not np.isfinite(rate):
            raise HarnessError(f"workload.arrival_rate={rate!r} must be a positive number of requests per second")


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """n arrival times (modeled seconds) of a Poisson process of `rate` per second: the
    cumulative sums of exponential gaps of mean 1/rate, drawn from numpy's generator."""
    check_arrivals("poisson", rate)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return [float(t) for t in np.cumsum(gaps)]


@dataclass
class Served:
    """What continuous serving did: the batched trace, and per request (prompt order) its
    arrival, the start of its first forward, and the ends of the batch forwards carrying it."""

    trace: RoutingTrace
    requests: list[Request]
    arrivals: list[float]
    starts: list[float] = field(default_factory=list)
    ends: list[list[float]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # each batch forward's modeled seconds
    running: list[int] = field(default_factory=list)  # each batch forward's members
    first: list[int] = field(default_factory=list)  # per request: the batch forward it joined


def continuous(trace: RoutingTrace, batch: int, arrivals: list[float],
               forward: Callable[[RoutingTrace, int], float]) -> Served:
    """Serve `trace`'s requests arriving at `arrivals` (prompt order, non-decreasing) with up
    to `batch` running (module docstring); `forward(merged, s)` charges batch forward s."""
    if batch < 1:
        raise HarnessError(f"workload.batch={batch} must be at least 1")
    prompts = prompt_rows(trace)
    if len(arrivals) != len(prompts):
        raise ValueError(f"{len(arrivals)} arrival times for {len(prompts)} requests")
    if any(b < a for a, b in pairwise(arrivals)) or any(a < 0 for a in arrivals):
        raise ValueError("arrival times must be non-negative and in prompt order")
    counts = recorded_tokens(trace, len(prompts))
    requests = [request_of(trace, rows, counts[p] if counts else None) for p, rows in enumerate(prompts)]
    merged = RoutingTrace(trace.n_layers, trace.n_experts, geometry=dict(trace.geometry),
                          meta={**trace.meta, "batch": batch, "arrivals": "continuous"})
    served = Served(merged, requests, list(arrivals), [0.0] * len(prompts), [[] for _ in prompts],
                    first=[0] * len(prompts))
    loads = trace.loads.numpy()
    clock, waiting, running, period = 0.0, 0, [], -1  # waiting: the next request not yet admitted
    done: dict[int, int] = {}  # running request -> its forwards taken
    while waiting < len(prompts) or running:
        if not running and arrivals[waiting] > clock:
            clock = arrivals[waiting]  # idle: nothing arrived yet
        if not running:
            period += 1  # a busy period: the forwards' `prompt` (systems see one per busy period)
        while waiting < len(prompts) and len(running) < batch and arrivals[waiting] <= clock:
            running.append(waiting)
            done[waiting] = 0
            served.starts[waiting] = clock
            served.first[waiting] = len(merged)
            waiting += 1
        rows = [prompts[p][done[p]] for p in running]
        base = trace.steps[named_member(trace, rows)]
        merged.add_step(StepInfo(period, base.block, base.step, len(merged), base.is_first_block, base.kind),
                        sum(trace.n_tokens[r] for r in rows), sum(trace.n_context[r] for r in rows))
        s = len(merged) - 1
        merged.set_step(s, loads[rows].sum(0), summed_hints(trace, rows), summed_hints(trace, rows, RESIDUAL))
        seconds = float(forward(merged, s))
        clock += seconds
        served.latencies.append(seconds)
        served.running.append(len(running))
        for p in running:
            served.ends[p].append(clock)
            done[p] += 1
        running = [p for p in running if done[p] < len(prompts[p])]
    return served


def arrival_figures(served: Served) -> dict[str, float]:
    """Per-request queueing delay, time to first token, time per output token and
    end-to-end latency from arrival: percentiles over the requests (as serving_figures)."""
    queue, ttft, tpot, e2e = [], [], [], []
    for p, request in enumerate(served.requests):
        arrival, start, first = served.arrivals[p], served.starts[p], served.first[p]
        end = np.asarray(served.ends[p], dtype=np.float64)
        own = np.asarray(served.latencies[first:first + request.forwards], dtype=np.float64)  # consecutive
        queue.append(start - arrival)
        ttft.append(float(end[request.first_token]) - arrival)
        per_token = request_tpot(own, end, request)
        if per_token is not None:
            tpot.append(per_token)
        e2e.append(float(end[-1]) - arrival)
    return {**percentiles("queue", queue), **percentiles("ttft", ttft), **percentiles("tpot", tpot),
            **percentiles("e2e_latency", e2e), **({"e2e_latency_mean_s": float(np.mean(e2e))} if e2e else {}),
            "serving_peak_running": max(served.running, default=0)}


def engine_forward(engine: OffloadEngine) -> Callable[[RoutingTrace, int], float]:
    """The `forward` of `continuous` that charges batch forward s on a prepared engine, layer
    by layer as `OffloadEngine.replay` does, and returns its modeled seconds."""
    def forward(merged: RoutingTrace, s: int) -> float:
        rows = merged.loads[s].to(torch.long).numpy()
        rows.flags.writeable = False  # as live: systems read the loads, never change them
        engine.replay_forward(merged, s, rows)
        return float(engine.ledger.step_series()[-1]["modeled_latency_s"])

    return forward
