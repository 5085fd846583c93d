"""How concentrated a trace's routing is: the statistics a table measured on proxy weights
must state (random proxies route far more unevenly than a trained, balanced model).

    python -m harness.routing_stats <trace.npz> [B ...]

Over the trace's denoising forwards, per MoE layer, averaged over layers:
  top-B share (whole trace)  fraction of routed (token, expert) pairs that went to the
                             layer's B most loaded experts over the whole trace (B/E if
                             perfectly balanced: 25% for B=64 of 256)
  top-B share (per step)     the same within each forward, averaged over forwards
  load entropy               entropy of the layer's whole-trace load over experts,
                             divided by log(E) (1 = perfectly balanced)
  experts used per step      distinct experts a forward routes to, averaged
"""

from __future__ import annotations

import math
import sys

import torch

from harness.errors import HarnessError
from harness.trace import RoutingTrace


def top_share(loads: torch.Tensor, b: int) -> torch.Tensor:
    """loads [..., E] -> the fraction of each row's total in its b largest entries."""
    total = loads.sum(-1).clamp(min=1)
    return loads.topk(min(b, loads.shape[-1]), dim=-1).values.sum(-1) / total


def routing_statistics(trace: RoutingTrace, bs: tuple[int, ...] = (64, 128)) -> dict[str, float]:
    rows = [i for i, s in enumerate(trace.steps) if s.kind == "denoise"]
    if not rows:
        raise HarnessError("the trace has no denoising steps; record it with a live run")
    loads = trace.loads[rows].double()  # [S, L, E]
    whole = loads.sum(0)  # [L, E]
    p = whole / whole.sum(-1, keepdim=True).clamp(min=1)
    entropy = -(p * p.clamp(min=1e-30).log()).sum(-1) / math.log(trace.n_experts)
    stats = {"forwards": float(len(rows)), "load_entropy": float(entropy.mean()),
             "experts_used_per_step": float((loads > 0).sum(-1).double().mean())}
    for b in bs:
        stats[f"top{b}_share_trace"] = float(top_share(whole, b).mean())
        stats[f"top{b}_share_step"] = float(top_share(loads, b).mean())
    return stats


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    try:
        trace = RoutingTrace.load(argv[0])
        bs = tuple(int(b) for b in argv[1:]) or (64, 128)
        stats = routing_statistics(trace, bs)
    except (HarnessError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for key, value in stats.items():
        print(f"{key}: {value:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
