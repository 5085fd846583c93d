"""Token-level routing statistics that decide caches (docs/real-routing.md): measured over a
trace's single-token forwards (an autoregressive decode's, whose loads are exactly its one
token's top-k experts), each prompt's in order; a trace without any (block diffusion) has
none of them.

  temporal_locality   share of a token's experts that the previous token of the same
                      prompt used at the same layer, mean over token pairs and layers
                      (uniform routing: k / E)
  lru_hit_rate        hits of a per-layer LRU cache of `capacity` experts (a quarter of the
                      experts by default) over each prompt's decode tokens, empty at its
                      first one: hits / routed (token, expert) pairs (uniform: ~capacity / E)
  prefill vs decode   load entropy of the prefill forwards' popularity and of the decoding
                      forwards' (a step of a block: denoise or decode), and the Pearson
                      correlation of a prompt's prefill popularity with its own decoding
                      popularity (mean over prompts and layers): whether the prompt tells
                      which experts its generation will use
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness.placement.trace import RoutingTrace


def single_token_runs(trace: RoutingTrace) -> list[np.ndarray]:
    """Per prompt, the bool [n, L, E] expert sets of its consecutive single-token decoding
    forwards (a run breaks where another forward comes between)."""
    runs: list[np.ndarray] = []
    loads = trace.loads
    current: list[int] = []
    for s, step in enumerate(trace.steps):
        single = step.in_block and trace.n_tokens[s] == 1
        if current and (not single or step.prompt != trace.steps[current[-1]].prompt or s != current[-1] + 1):
            runs.append((loads[current] > 0).numpy())
            current = []
        if single:
            current.append(s)
    if current:
        runs.append((loads[current] > 0).numpy())
    return runs


def temporal_locality(runs: list[np.ndarray]) -> float:
    shared, used = 0, 0
    for masks in runs:
        if len(masks) > 1:
            shared += int((masks[1:] & masks[:-1]).sum())
            used += int(masks[1:].sum())
    return shared / used if used else math.nan


def lru_hit_rate(runs: list[np.ndarray], capacity: int) -> float:
    """Hits of an LRU cache per layer (module docstring); a token's experts are stamped in
    ascending id order, so every stamp differs and the cache holds exactly its newest."""
    hits, routed = 0, 0
    for masks in runs:
        n_layers, n_experts = masks.shape[1:]
        last = np.full((n_layers, n_experts), -1, dtype=np.int64)
        ids = np.arange(n_experts, dtype=np.int64)
        for t, mask in enumerate(masks):
            if capacity < n_experts:
                threshold = np.partition(last, n_experts - capacity, axis=1)[:, n_experts - capacity]
                cached = (last >= threshold[:, None]) & (last >= 0)
            else:
                cached = last >= 0
            hits += int((mask & cached).sum())
            routed += int(mask.sum())
            stamps = np.broadcast_to(t * n_experts + ids, mask.shape)
            last[mask] = stamps[mask]
    return hits / routed if routed else math.nan


def prefill_decode(trace: RoutingTrace, entropy, pearson) -> dict[str, float]:
    """The prefill-vs-decode figures; `entropy` and `pearson` are routing_stats' measures."""
    loads = trace.loads
    prefill = torch.tensor([s.kind == "prefill" for s in trace.steps], dtype=torch.bool)
    decoding = torch.tensor([s.in_block for s in trace.steps], dtype=torch.bool)
    prompts = torch.tensor([s.prompt for s in trace.steps], dtype=torch.long)
    corr = []
    for p in sorted(set(prompts.tolist())):
        mine = prompts == p
        if bool((mine & prefill).any()) and bool((mine & decoding).any()):
            corr.append(pearson(loads[mine & prefill].sum(0), loads[mine & decoding].sum(0)))
    values = torch.cat(corr) if corr else torch.zeros(0)
    values = values[~values.isnan()]
    return {
        "load_entropy_prefill": entropy(loads[prefill].sum(0)) if bool(prefill.any()) else math.nan,
        "load_entropy_decode": entropy(loads[decoding].sum(0)) if bool(decoding.any()) else math.nan,
        "prefill_decode_popularity_corr": float(values.mean()) if values.numel() else math.nan,
    }


def lru_capacity(n_experts: int) -> int:
    """The LRU cache the statistics use: a quarter of the experts (at least one)."""
    return max(1, n_experts // 4)
