"""DALI's own measures over a routing trace (docs/dali-and-gem.md): how well the
next layer's experts are predicted, and how often a per-layer expert cache of B experts
hits under three replacement rules. They read only the trace (loads, hints, forward kinds),
so every system replayed over one trace gets the same figures: they compare predictors and
replacement rules on equal terms, not systems.

Prefetch prediction. Before MoE layer l+1 runs, a predictor names k = top_k experts (the
experts one token routes to); the experts layer l+1 actually uses are those with load > 0.
Per (forward, layer l < L-1): hits = named experts used; precision = hits / k summed,
recall = hits / used summed (micro averages over every forward and layer of a phase).
With one token (a decode forward) the layer uses exactly top_k experts, so precision and
recall coincide; a prefill forward uses many more, so recall is low by construction.

  residual     dali's predictor (its default): the trace's residual hint for layer l+1
               (its gate applied to layer l's router input minus that layer's running
               mean, summed over tokens; harness/model/hints.py), heaviest first
  next_gate    the trace's next_gate hint (the same gate on the router input itself:
               mixtral_offload's, and dali's with predictor=next_gate), heaviest first
  token_count  the experts with the most tokens routed to layer l+1 in all earlier forwards
               of the run (the history a count-based predictor has); ties, and the first
               forward, to the lower id

Cache replays. Per MoE layer a cache of `capacity` experts, holding experts 0..B-1 at the
start (as dali and mixtral_offload start). At each forward the layer demands its routed
experts; a demanded expert in the cache is a hit. The misses are then admitted one by one
into a free slot, else in place of a victim: a cached expert this layer does not use now,
chosen by the rule; a miss that finds no slot is not cached (a one-use copy).

  lru       misses heaviest first (ties: lower id); victim: least recently used (the
            forward that last routed it; ties: the lower id, the initial contents in id order)
  lfu       misses heaviest first; victim: fewest forwards that routed it so far (ties: lower id)
  workload  dali's replacement (systems/dali.py): the time-correlation score, the tokens
            routed to the expert over the layer's last `horizon` forwards (this one
            included: updated before admission); misses highest score first (ties: lower
            id); victim: lowest score (ties: lower id), replaced only when the miss scores
            higher (a pure cache: nothing forces a miss in)

hit rate = hits / demanded experts, over every forward and layer of a phase. Phases are
the forwards' kinds (prefill, decode; denoise and commit for block diffusion); figures
without a suffix cover the whole run.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from harness.model.hints import HINT_CHANNELS, NEXT_GATE, RESIDUAL
from harness.placement.trace import RoutingTrace
from systems.dali import DaliConfig

PREDICTORS = ("residual", "token_count")
REPLACEMENTS = ("workload", "lru", "lfu")

# the time-correlation score's horizon when a run's system has none: DALI's default
DEFAULT_HORIZON = DaliConfig.horizon


def kinds_of(trace: RoutingTrace) -> np.ndarray:
    """The forwards' kinds, as a str array [F]."""
    return np.array([s.kind for s in trace.steps], dtype=object)


def trace_hints(trace: RoutingTrace, channel: str = NEXT_GATE) -> tuple[np.ndarray, np.ndarray] | None:
    """(hints float [F, L, E] of `channel`, bool [F]: the forward recorded them), or None without any."""
    if not trace.has_channel(channel):
        return None
    rows = [trace.step_hints(s, channel) for s in range(len(trace))]
    valid = np.array([h is not None for h in rows])
    zeros = np.zeros((trace.n_layers, trace.n_experts), np.float32)
    return np.stack([zeros if h is None else h.numpy() for h in rows]), valid


# ---- prediction ------------------------------------------------------------------------
def top_k_named(scores: np.ndarray, k: int) -> np.ndarray:
    """int [..., k]: the k highest scores' ids along the last axis, ties to the lower id."""
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def prediction_counts(named: np.ndarray, used: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per forward [F]: hits, experts named, experts used; `named` int [F, M, k] predicts
    the rows of `used` bool [F, M, E]."""
    hits = np.take_along_axis(used, named, axis=-1).sum(axis=(1, 2))
    return hits, np.full(used.shape[0], named.shape[1] * named.shape[2]), used.sum(axis=(1, 2))


def predictor_counts(loads: np.ndarray, hints: np.ndarray | None, k: int, name: str = RESIDUAL
                     ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per predictor, per forward [F]: (hits, named, used) over layers 0..L-2 predicting
    layers 1..L-1. loads int [F, L, E]; hints float [F, L, E] of the channel `name` (row l
    predicts layer l+1) or None (no figures of that channel)."""
    loads = loads.astype(np.int64)
    used = loads[:, 1:] > 0
    k = min(k, loads.shape[-1])
    history = np.cumsum(loads, axis=0) - loads  # tokens each expert got in the earlier forwards
    out = {"token_count": prediction_counts(top_k_named(history[:, 1:], k), used)}
    if hints is not None:
        out[name] = prediction_counts(top_k_named(hints[:, :-1], k), used)
    return out


# ---- cache replays ---------------------------------------------------------------------
def replay_cache(loads: np.ndarray, capacity: int, rule: str, horizon: int = DEFAULT_HORIZON) -> np.ndarray:
    """Per forward [F]: demanded experts found in the cache, under replacement `rule`
    (lru | lfu | workload), every layer at once. loads int [F, L, E].

    A layer's admissions are a prefix of its misses in admission order: the first `free`
    take free slots, the next ones pair with the victims in victim order (the i-th
    replacing miss with the i-th victim) while there are victims and, for workload, while
    the miss scores higher; misses come highest score first and victims lowest first, so
    once a pair fails every later one fails too (tests/unit/test_dali_measures.py holds this
    to the one-miss-at-a-time rule)."""
    if rule not in REPLACEMENTS:
        raise ValueError(f"unknown replacement rule {rule!r}; known: {', '.join(REPLACEMENTS)}")
    n_forwards, n_layers, n_experts = loads.shape
    capacity = min(capacity, n_experts)
    ids = np.arange(n_experts)
    cached = np.broadcast_to(ids < capacity, (n_layers, n_experts)).copy()
    last = np.full((n_layers, n_experts), -1, np.int64)  # lru: the last forward that routed it
    uses = np.zeros((n_layers, n_experts), np.int64)  # lfu
    score = np.zeros((n_layers, n_experts))  # workload
    hits = np.zeros(n_forwards, np.int64)
    steps = np.arange(n_experts)
    for f in range(n_forwards):
        load = loads[f].astype(np.int64)
        demand = load > 0
        hits[f] = np.count_nonzero(demand & cached)
        score = score + load - (loads[f - horizon].astype(np.int64) if f >= horizon else 0)
        if rule == "workload":
            priority, victim_key = -score, score
        else:
            priority = -load.astype(np.float64)
            victim_key = (last if rule == "lru" else uses) * n_experts + ids
        misses, victims = demand & ~cached, cached & ~demand
        miss_order = np.argsort(np.where(misses, priority, np.inf), axis=1, kind="stable")
        victim_order = np.argsort(np.where(victims, victim_key, np.inf), axis=1, kind="stable")
        n_miss, n_victims = misses.sum(1), victims.sum(1)
        free = np.minimum(n_miss, capacity - cached.sum(1))
        # pair j: the (free + j)-th miss with the j-th victim
        paired = (steps < np.minimum(n_miss - free, n_victims)[:, None])
        if rule == "workload":
            miss_at = np.take_along_axis(miss_order, np.minimum(free[:, None] + steps, n_experts - 1), axis=1)
            paired &= (np.take_along_axis(score, miss_at, axis=1)
                       > np.take_along_axis(score, victim_order, axis=1))
        replaced = np.cumprod(paired, axis=1).sum(1)
        admitted = _first(miss_order, free + replaced)
        evicted = _first(victim_order, replaced)
        cached = (cached & ~evicted) | admitted
        last[demand] = f
        uses += demand
    return hits


def _first(order: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """bool [L, E]: per row, the first counts[row] ids of order[row]."""
    mask = np.zeros(order.shape, bool)
    np.put_along_axis(mask, order, np.arange(order.shape[1]) < counts[:, None], axis=1)
    return mask


# ---- per phase -------------------------------------------------------------------------
def by_phase(kinds: np.ndarray, columns: Iterable[np.ndarray]) -> dict[str, list[int]]:
    """'' (the whole run) and each kind present -> the columns' sums over its forwards."""
    columns = list(columns)
    out = {"": [int(c.sum()) for c in columns]}
    for kind in dict.fromkeys(kinds.tolist()):
        mask = kinds == kind
        out[kind] = [int(c[mask].sum()) for c in columns]
    return out


def _name(base: str, phase: str) -> str:
    return f"{base}_{phase}" if phase else base


def ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else float("nan")


def prediction_measures(kinds: np.ndarray, loads: np.ndarray, hints: np.ndarray | None, top_k: int,
                        channel: str = RESIDUAL) -> dict[str, float]:
    """prefetch_{precision,recall}_<predictor>[_<phase>]; a phase with no layer to predict
    reports none (without hints: no figures of their channel)."""
    out: dict[str, float] = {}
    for name, (hits, named, used) in predictor_counts(loads, hints, top_k, channel).items():
        for phase, (h, n, u) in by_phase(kinds, (hits, named, used)).items():
            if n:
                out[_name(f"prefetch_precision_{name}", phase)] = ratio(h, n)
            if u:
                out[_name(f"prefetch_recall_{name}", phase)] = ratio(h, u)
    return out


def cache_measures(kinds: np.ndarray, loads: np.ndarray, capacity: int,
                   horizon: int = DEFAULT_HORIZON) -> dict[str, float]:
    """cache_hit_rate_<rule>[_<phase>]; a phase that demanded nothing reports none."""
    out: dict[str, float] = {}
    demanded = (loads > 0).sum(axis=(1, 2))
    for rule in REPLACEMENTS:
        hits = replay_cache(loads, capacity, rule, horizon)
        for phase, (h, d) in by_phase(kinds, (hits, demanded)).items():
            if d:
                out[_name(f"cache_hit_rate_{rule}", phase)] = ratio(h, d)
    return out


def measures_of_trace(trace: RoutingTrace, capacity: int, top_k: int,
                      horizon: int = DEFAULT_HORIZON) -> dict[str, float]:
    """Both kinds of measure over a RoutingTrace; each hint channel's predictor over the
    forwards that recorded it (a replayed trace may lack them: an older recording has no
    residual channel), everything else over every forward."""
    loads = trace.loads.numpy()
    kinds = kinds_of(trace)
    out = prediction_measures(kinds, loads, None, top_k)
    for channel in HINT_CHANNELS:
        recorded = trace_hints(trace, channel)
        if recorded is not None:
            hints, valid = recorded
            figures = prediction_measures(kinds[valid], loads[valid], hints[valid], top_k, channel)
            out.update({k: v for k, v in figures.items() if f"_{channel}" in k})
    out.update(cache_measures(kinds, loads, capacity, horizon))
    return out
