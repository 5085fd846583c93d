"""Temporal stability of routing within blocks: for each MoE layer, the cosine similarity of
a denoising step's expert-load vector with the one k steps later, and the fraction of the
top-B experts still in the top-B set. harness/analyze.py prints and plots it,
harness/traces/routing_stats.py reports its cosines; a leaf below both."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from harness.placement.trace import RoutingTrace

if TYPE_CHECKING:
    import pandas as pd


def denoise_runs(trace: RoutingTrace) -> list[list[int]]:
    """Step indices of each (prompt, block), denoising steps only, in step order."""
    runs: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, s in enumerate(trace.steps):
        if s.in_block:
            runs[(s.prompt, s.block)].append(i)
    return [sorted(idx, key=lambda i: trace.steps[i].step) for idx in runs.values()]


def top_set(load: torch.Tensor, b: int) -> torch.Tensor:
    """Bool [L, E]: the top-b experts by load in each layer (loaded experts only)."""
    b = min(b, load.shape[-1])
    idx = load.float().topk(b, dim=-1).indices
    mask = torch.zeros_like(load, dtype=torch.bool).scatter_(-1, idx, True)
    return mask & (load > 0)


def stability_table(trace: RoutingTrace, experts_per_layer: int, max_k: int = 8) -> pd.DataFrame:
    """One row per k: mean cosine similarity and top-B retention, with the pair count."""
    import pandas as pd  # a run imports this module; only the analysis needs pandas (~0.5 s to import)

    loads = trace.loads.float()
    sums: dict[int, list[float]] = {k: [0.0, 0.0, 0] for k in range(1, max_k + 1)}
    for run in denoise_runs(trace):
        for a_pos, a in enumerate(run):
            top_a = top_set(loads[a], experts_per_layer)
            for k in range(1, max_k + 1):
                if a_pos + k >= len(run):
                    break
                b = run[a_pos + k]
                cos = torch.nn.functional.cosine_similarity(loads[a], loads[b], dim=-1)  # [L]
                top_b = top_set(loads[b], experts_per_layer)
                kept = (top_a & top_b).sum(-1).float() / top_a.sum(-1).clamp(min=1).float()
                sums[k][0] += float(cos.sum())
                sums[k][1] += float(kept.sum())
                sums[k][2] += loads.shape[1]
    rows = [
        {"k": k, "cosine": c / n if n else float("nan"), "topB_retained": r / n if n else float("nan"),
         "pairs": n}
        for k, (c, r, n) in sums.items()
    ]
    return pd.DataFrame(rows)
