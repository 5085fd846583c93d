"""How realistic a routing trace is: the statistics put beside every result (docs/proxies.md)
(result.json's `routing`, MLflow's routing_* metrics, the report, `harness.analyze
format=json`), and a command that prints them for one trace at several B:

    python -m harness.traces.routing_stats <trace.npz> [B ...]

All of them read a `RoutingTrace` (loads [forwards, MoE layers, experts]):

  distinct_experts_per_layer_step  experts with at least one token, mean over denoising
                                   forwards and MoE layers
  top_b_share                      share of a layer's routed pairs (over the whole run) that
                                   fall on its B most used experts, mean over layers
  unused_experts_per_layer         experts never routed in the run, mean over layers
  popularity_cv                    std / mean of a layer's expert counts over the run, mean
                                   over layers
  cross_prompt_popularity_corr     Pearson correlation of two prompts' per-layer expert
                                   counts, mean over ordered pairs of prompts and layers (how
                                   well one prompt's popularity predicts another's)
  cosine_by_k                      cosine similarity of a layer's load k denoising steps
                                   apart within a block, k = 1..max_k (harness.analyze)
  tokens_per_denoise_step          generated tokens / denoising forwards (the threshold
                                   rule's parallelism; from the trace's meta)
  top_b_share_step                 the top-B share within each denoising forward, mean
                                   over forwards and layers (what one step's placement sees)
  load_entropy                     entropy of a layer's popularity over the run divided by
                                   log(E) (1 = perfectly even), mean over layers
  forwards                         denoising forwards in the trace
  temporal_locality                share of a token's experts the previous token used at the same
                                   layer (autoregressive decodes; harness/traces/locality.py)
  lru_hit_rate                     hit rate of a per-layer LRU cache of lru_B = E/4 experts over
                                   each prompt's decode tokens (harness/traces/locality.py)
  load_entropy_prefill,            load entropy of the prefill forwards and of the decoding ones,
  load_entropy_decode,             and how well a prompt's prefill popularity predicts its own
  prefill_decode_popularity_corr   decoding popularity (Pearson; harness/traces/locality.py)
  repetition_mean, repetition_max, share of the generated tokens in a greedy decode loop (a short
  looping_requests                 cycle repeated to the end), from the recorded token ids
                                   (harness/traces/repetition.py); None without them and
                                   for the uniform reference (routing does not make a loop)

"Over the run" counts every forward (prefill, denoising and commit): all of them are
served by the resident experts. `uniform_statistics` computes the same numbers for a trace
with the same forwards and token counts whose tokens each pick top-k distinct experts
uniformly at random: the reference a balanced, content-blind router would give.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from harness.common.errors import HarnessError, exit_with
from harness.placement.trace import RoutingTrace
from harness.traces.locality import lru_capacity, lru_hit_rate, prefill_decode, single_token_runs, temporal_locality
from harness.traces.repetition import repetition_statistics
from harness.traces.stability import stability_table

STAT_KEYS = ("distinct_experts_per_layer_step", "top_b_share", "unused_experts_per_layer", "popularity_cv",
             "cross_prompt_popularity_corr", "tokens_per_denoise_step", "top_b_share_step", "load_entropy",
             "temporal_locality", "lru_hit_rate", "load_entropy_prefill", "load_entropy_decode",
             "prefill_decode_popularity_corr", "repetition_mean", "repetition_max", "looping_requests")


def _finite(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def distinct_per_step(loads: torch.Tensor, denoise: torch.Tensor) -> float:
    rows = loads[denoise]
    return float((rows > 0).sum(-1).float().mean()) if rows.numel() else math.nan


def top_b_share(popularity: torch.Tensor, b: int) -> float:
    """popularity [..., E] counts -> the share of each row's total on its b largest entries,
    mean over the rows that routed anything."""
    total = popularity.sum(-1).float()
    top = popularity.float().topk(min(b, popularity.shape[-1]), dim=-1).values.sum(-1)
    keep = total > 0
    return float((top[keep] / total[keep]).mean()) if keep.any() else math.nan


def load_entropy(popularity: torch.Tensor) -> float:
    """Entropy of each layer's load over experts / log(E), mean over layers that routed."""
    pop = popularity.double()
    total = pop.sum(-1, keepdim=True)
    keep = total.squeeze(-1) > 0
    if not keep.any():
        return math.nan
    p = pop[keep] / total[keep]
    return float((-(p * p.clamp(min=1e-30).log()).sum(-1) / math.log(popularity.shape[-1])).mean())


def unused_experts(popularity: torch.Tensor) -> float:
    return float((popularity == 0).sum(-1).float().mean())


def popularity_cv(popularity: torch.Tensor) -> float:
    pop = popularity.float()
    mean = pop.mean(-1)
    keep = mean > 0
    return float((pop.std(-1, unbiased=False)[keep] / mean[keep]).mean()) if keep.any() else math.nan


def pearson_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise Pearson correlation of [L, E] tensors; NaN where a row is constant."""
    a = a.float() - a.float().mean(-1, keepdim=True)
    b = b.float() - b.float().mean(-1, keepdim=True)
    denom = a.norm(dim=-1) * b.norm(dim=-1)
    return torch.where(denom > 0, (a * b).sum(-1) / denom.clamp(min=1e-30), torch.full_like(denom, math.nan))


def cross_prompt_corr(loads: torch.Tensor, prompts: torch.Tensor) -> float:
    """Mean Pearson correlation of per-layer popularity over pairs of distinct prompts."""
    ids = sorted(set(prompts.tolist()))
    per_prompt = [loads[prompts == p].sum(0) for p in ids]
    values = [pearson_rows(per_prompt[i], per_prompt[j]) for i in range(len(ids)) for j in range(len(ids)) if i != j]
    if not values:
        return math.nan
    stacked = torch.stack(values)
    ok = ~stacked.isnan()
    return float(stacked[ok].mean()) if ok.any() else math.nan


def tokens_per_denoise_step(meta: dict[str, Any]) -> float:
    steps, tokens = meta.get("denoise_steps"), meta.get("generated_tokens")
    return tokens / steps if steps else math.nan


def routing_statistics(trace: RoutingTrace, b: int, max_k: int = 8) -> dict[str, Any]:
    """The statistics of the module docstring, JSON-ready (None where undefined); a trace
    without denoising forwards (nothing was decoded) is an error."""
    loads = trace.loads
    denoise = torch.tensor([s.in_block for s in trace.steps], dtype=torch.bool)
    if not bool(denoise.any()):
        raise HarnessError("the trace has no denoising steps; record one with a live run (trace.record=true)")
    prompts = torch.tensor([s.prompt for s in trace.steps], dtype=torch.long)
    popularity = loads.sum(0)
    cosine = stability_table(trace, b, max_k)["cosine"].tolist() if len(trace) else []
    stats = {
        "distinct_experts_per_layer_step": distinct_per_step(loads, denoise),
        "top_b_share": top_b_share(popularity, b),
        "unused_experts_per_layer": unused_experts(popularity),
        "popularity_cv": popularity_cv(popularity),
        "cross_prompt_popularity_corr": cross_prompt_corr(loads, prompts),
        "tokens_per_denoise_step": tokens_per_denoise_step(trace.meta),
        "top_b_share_step": top_b_share(loads[denoise], b),
        "load_entropy": load_entropy(popularity),
    }
    runs = single_token_runs(trace)
    capacity = lru_capacity(trace.n_experts)
    stats.update(temporal_locality=temporal_locality(runs), lru_hit_rate=lru_hit_rate(runs, capacity),
                 **prefill_decode(trace, load_entropy, pearson_rows), **repetition_statistics(trace.meta))
    out: dict[str, Any] = {k: _finite(v) for k, v in stats.items()}
    out["cosine_by_k"] = [_finite(c) for c in cosine]
    out["B"] = b
    out["lru_B"] = capacity
    out["forwards"] = int(denoise.sum())
    return out


def top_k_of(trace: RoutingTrace) -> int:
    k = trace.geometry.get("num_experts_per_tok")
    if k:
        return int(k)
    routed = [int(trace.loads[i, 0].sum()) for i in range(len(trace)) if trace.n_tokens[i]]
    return max(1, routed[0] // next(t for t in trace.n_tokens if t)) if routed else 8


def uniform_like(trace: RoutingTrace, seed: int = 0) -> RoutingTrace:
    """The same forwards and token counts, each token routed to top-k distinct experts
    chosen uniformly at random (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    k = top_k_of(trace)
    out = RoutingTrace(trace.n_layers, trace.n_experts, geometry=dict(trace.geometry), meta=dict(trace.meta))
    for step, n_tokens, n_context in zip(trace.steps, trace.n_tokens, trace.n_context, strict=True):
        out.add_step(step, n_tokens, n_context)
        if n_tokens:
            picks = torch.rand(trace.n_layers, n_tokens, trace.n_experts, generator=gen).topk(k, dim=-1).indices
            offsets = torch.arange(trace.n_layers)[:, None, None] * trace.n_experts
            counts = torch.bincount((picks + offsets).reshape(-1), minlength=trace.n_layers * trace.n_experts)
            out._loads[-1] = counts.view(trace.n_layers, trace.n_experts).to(torch.int32)
    return out


def uniform_statistics(trace: RoutingTrace, b: int, max_k: int = 8, seed: int = 0) -> dict[str, Any]:
    stats = routing_statistics(uniform_like(trace, seed), b, max_k)
    stats["tokens_per_denoise_step"] = None  # a property of the model's confidence, not of routing
    for key in ("repetition_mean", "repetition_max", "looping_requests"):
        stats[key] = None  # a property of the decoded text, not of routing
    return stats


def statistics_with_uniform(trace: RoutingTrace, b: int, max_k: int = 8) -> dict[str, Any]:
    """What result.json stores under `routing`: the statistics and their uniform values."""
    return {**routing_statistics(trace, b, max_k), "uniform": uniform_statistics(trace, b, max_k)}


def routing_metrics(routing: dict[str, Any]) -> dict[str, float]:
    """Flat numeric metrics for MLflow: routing_<stat>, routing_cosine_k<k>, routing_uniform_<stat>."""
    metrics: dict[str, float] = {}
    for prefix, stats in (("routing_", routing), ("routing_uniform_", routing.get("uniform") or {})):
        for key in STAT_KEYS:
            if stats.get(key) is not None:
                metrics[prefix + key] = float(stats[key])
        for k, value in enumerate(stats.get("cosine_by_k") or [], start=1):
            if value is not None:
                metrics[f"{prefix}cosine_k{k}"] = float(value)
    return metrics


def main(argv: list[str]) -> int:
    """Print the statistics of one trace for each B (default 64 and 128)."""
    if not argv:
        raise HarnessError("usage: python -m harness.traces.routing_stats <trace.npz> [B ...]")
    try:
        bs = [int(b) for b in argv[1:]] or [64, 128]
    except ValueError:
        raise HarnessError(f"B values {argv[1:]} must be integers") from None
    trace = RoutingTrace.load(argv[0])
    if not all(1 <= b <= trace.n_experts for b in bs):
        raise HarnessError(f"B values {bs} must be between 1 and the trace's {trace.n_experts} experts per layer")
    for b in bs:
        stats = statistics_with_uniform(trace, b)
        print(f"B={b}: " + ", ".join(f"{k}={_show(stats[k])} (uniform {_show(stats['uniform'].get(k))})"
                                     for k in STAT_KEYS))
        print(f"  cosine_by_k={[_show(c) for c in stats['cosine_by_k']]}")
    return 0


def _show(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
