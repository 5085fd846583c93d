"""`calibration_shared`: how much of the workload's common popularity the calibration shares
(docs/routing-regimes.md, "Fit"). A model's calibration prompts are not the workload's
problems, so a calibration-learnt placement predicts a recorded workload less well than
generated calibration requests at the workload's own `shared` predict a generated one.

The statistic: the Pearson correlation, per layer, of the calibration's pooled expert loads
(every forward of every calibration request: what the systems that learn read) with each
workload request's decoding popularity, mean over layers and requests. `fit_calibration`
matches it by bisection on `calibration_shared` (the statistic rises with it), generating the
workload with its calibration requests as a replay does (harness/routing/replayable.py),
one fixed seed (common random numbers).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from harness.placement.trace import RoutingTrace
from harness.routing.generate import Dims, simulate
from harness.routing.params import RoutingRegime, TraceShape
from harness.routing.replayable import with_calibration

BISECTIONS = 10  # bracket [0, 1] to within 0.001


def calibration_overlap(workload: np.ndarray, kinds: list[str], prompts: list[int], calibration: np.ndarray
                        ) -> float:
    """The module docstring's statistic: workload loads [S, L, E] with each forward's kind and
    request, calibration loads [C, L, E]; nan without decoding forwards or calibration loads."""
    kind, prompt = np.array(kinds), np.array(prompts)
    decoding = (kind == "denoise") | (kind == "decode")
    pops = [workload[decoding & (prompt == p)].sum(0) for p in sorted(set(prompts))]
    pops = [p for p in pops if p.sum() > 0]
    cal = calibration.sum(0).astype(np.float64)  # [L, E]
    if not pops or cal.sum() == 0:
        return math.nan

    def unit(x: np.ndarray) -> np.ndarray:
        z = x - x.mean(-1, keepdims=True)
        n = np.linalg.norm(z, axis=-1, keepdims=True)
        return np.where(n > 0, z / np.clip(n, 1e-30, None), np.nan)

    c = unit(cal)
    corr = [(unit(p.astype(np.float64)) * c).sum(-1) for p in pops]  # [L] each
    return float(np.nanmean(np.stack(corr)))


def trace_calibration_overlap(trace: RoutingTrace, calibration: RoutingTrace) -> float:
    return calibration_overlap(trace.loads.numpy(), [s.kind for s in trace.steps], [s.prompt for s in trace.steps],
                               calibration.loads.numpy())


def simulated_overlap(regime: RoutingRegime, shape: TraceShape, dims: Dims, seed: int, calibration: int) -> float:
    """The statistic on the regime's workload and its `calibration` generated requests."""
    sim = simulate(regime, with_calibration(shape, calibration), dims, seed, calibration)
    prompts = [info.prompt for info, _, _ in sim.steps]
    loads = np.stack(sim.loads)
    work = np.array(prompts) < shape.requests
    kinds = [info.kind for info, _, _ in sim.steps]
    return calibration_overlap(loads[work], [k for k, w in zip(kinds, work, strict=True) if w],
                               [p for p, w in zip(prompts, work, strict=True) if w], loads[~work])


def fit_calibration(regime: RoutingRegime, shape: TraceShape, dims: Dims, target: float, seed: int = 0,
                    calibration: int = 2) -> tuple[RoutingRegime, dict[str, float | None]]:
    """The regime with `calibration_shared` whose generated calibration overlaps its workload as
    `target` says (clamped to [0, 1]), and the record {target, reached}."""
    if math.isnan(target):
        return regime, {"target": None, "reached": None}
    low, high = 0.0, 1.0
    at = {}
    for share in (low, high):
        at[share] = simulated_overlap(replace(regime, calibration_shared=share), shape, dims, seed, calibration)
    if target <= at[low] or target >= at[high]:
        share = low if target <= at[low] else high
    else:
        for _ in range(BISECTIONS):
            mid = (low + high) / 2
            at[mid] = simulated_overlap(replace(regime, calibration_shared=mid), shape, dims, seed, calibration)
            low, high = (mid, high) if at[mid] < target else (low, mid)
        share = min((low, high), key=lambda s: abs(at[s] - target))
    return replace(regime, calibration_shared=round(share, 4)), {"target": round(target, 5),
                                                                 "reached": round(at[share], 5)}
