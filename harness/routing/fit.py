"""Fit a `RoutingRegime` to any trace (a harness recording, an import, a generated one) by
simulated moments (docs/routing-regimes.md): each knob is matched to its statistic
(harness/routing/moments.py) jointly (Levenberg-Marquardt), generating traces of the fitted trace's own
shape and geometry with one fixed seed (common random numbers keep each statistic monotone
in its knob); the knobs are solved together because they interact (locality also
concentrates a request's popularity, affinity also repeats experts over time).
`hint_quality` and `residual_hint_quality` are read off the trace's hints of each channel directly,
`period` off its overlap at lags 1..4, and `hint_sharpness` last, against the fitted knobs:
the power that gives the generated hints the entropy of the trace's (the channel DALI reads).
`mask_overlap` and `masked_locality` are searched only when asked (`also`, OPT_IN): their
statistics are always read and recorded (target and reached); the mini anchor is fitted with
`also=mask_overlap` (every system within 5%), both together moved mini's systems further off
(docs/routing-regimes.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from tqdm import tqdm

from harness.common.errors import HarnessError
from harness.model.hints import NEXT_GATE, RESIDUAL
from harness.placement.trace import RoutingTrace
from harness.routing.calibration_fit import fit_calibration, trace_calibration_overlap
from harness.routing.generate import Dims, generate, predicted_loads, sharpened, simulate
from harness.routing.moments import (
    dali_hint_rows,
    head_share,
    hint_entropy,
    moments,
    period_of,
    request_popularity,
    shape_of,
    trace_head_share,
    trace_lag_profile,
    trace_moments,
)
from harness.routing.params import RANGES, RegimeFile, RoutingRegime, TraceShape

# knob -> (its statistic rises with it?, bracket searched)
SEARCH = {"skew": (False, (0.0, 3.0)), "shared": (True, (0.0, 1.0)), "locality": (True, (0.0, 0.95)),
          "decay": (True, (0.0, 0.9)), "affinity": (True, (0.0, 0.95)),
          "cohesion": (False, (0.0, 0.95)), "unmasking": (True, (0.0, 1.0)), "prefill_skew": (False, (0.0, 3.0)),
          "prefill_overlap": (True, (0.0, 1.0)), "unmask_redraw": (False, (0.0, 1.0)),
          "solo_locality": (True, (0.0, 0.95))}
# searched only when `fit` is asked to (also=): mini's anchor fits mask_overlap; both together moved its systems off
OPT_IN = {"mask_overlap": (True, (0.0, 1.0)), "masked_locality": (True, (0.0, 0.95))}
ITERATIONS, STEP, TOLERANCE = 12, 0.05, 0.002
POPULARITY_SHAPES = ("zipf", "lognormal")  # the popularity shapes `fit` tries (params.py `lognormal`)
# head shares closer than this tie (what the seed alone moves them: mini's Zipf fit 0.2616..0.2687
# over seeds 0..3, docs/routing-regimes.md)
HEAD_SHARE_TIE = 0.005
# a second start, mildly skewed and mostly shared: from the defaults the solver can reach skew 0,
# where `shared` no longer moves any statistic and the search stalls
SECOND_START = RoutingRegime(skew=0.5, shared=0.8, locality=0.1, decay=0.1, affinity=0.3, cohesion=0.0,
                             prefill_skew=0.5)
# where both starts put cohesion and unmasking when the trace shows them (a denoising trace): at
# cohesion 0 unmasking moves no statistic, and the solver stalled there (docs/routing-regimes.md)
DENOISING_START = {"cohesion": 0.3, "unmasking": 0.3, "unmask_redraw": 0.5}


def averaged_moments(regime: RoutingRegime, shape: TraceShape, dims: Dims, seeds: range) -> dict[str, float]:
    """The statistics of traces generated at each seed of `seeds`, averaged (nan where one is):
    several seeds keep the fit from matching one generated trace's chance fluctuations, which a
    short trace has (mini's 8 requests: its systems' figures moved 2-3 points from the fit's seed
    to the next ones, docs/routing-regimes.md)."""
    each = [simulated_moments(regime, shape, dims, s) for s in seeds]
    return {k: float(np.mean([m[k] for m in each])) for k in each[0]}


def simulated_moments(regime: RoutingRegime, shape: TraceShape, dims: Dims, seed: int) -> dict[str, float]:
    sim = simulate(regime, shape, dims, seed)
    infos = [info for info, _, _ in sim.steps]
    loads = np.stack(sim.loads)
    period = int(regime.period)
    if shape.mode == "block" and shape.cache == "none":  # as a no-cache trace routes the window
        return trace_moments(generate(regime, shape, dims, seed), period)
    return moments(loads, [i.kind for i in infos], [i.prompt for i in infos], [i.block for i in infos],
                   [t for _, t, _ in sim.steps], period)


def choose_shape(fits: dict[str, tuple[float, float]], head: float) -> str:
    """The popularity shape to keep, of fits {shape: (misfit, head share reached)}: each shape
    matches the knobs' statistics about equally (as many knobs as statistics), so the head
    share, which neither fits, decides, among the shapes whose misfit is within 4x the best's
    (+ 1e-4); head shares within HEAD_SHARE_TIE of the closest tie, and the lower misfit of
    those decides; without a head share (nan), the first such shape."""
    floor = 4 * min(m for m, _ in fits.values()) + 1e-4
    fine = [n for n, (m, _) in fits.items() if m <= floor]
    if math.isnan(head):
        return fine[0]
    closest = min(abs(fits[n][1] - head) for n in fine)
    tied = [n for n in fine if abs(fits[n][1] - head) <= closest + HEAD_SHARE_TIE]
    return min(tied, key=lambda n: fits[n][0])


def simulated_head_share(regime: RoutingRegime, shape: TraceShape, dims: Dims, seed: int) -> float:
    sim = simulate(regime, shape, dims, seed)
    pop, _ = request_popularity(np.stack(sim.loads), [i.kind for i, _, _ in sim.steps],
                                [i.prompt for i, _, _ in sim.steps])
    return head_share(pop, dims.top_k)


def hint_quality(trace: RoutingTrace, channel: str = NEXT_GATE) -> float | None:
    """Least-squares q in hint ~ q x next load + (1 - q) x the request's mean next load (each
    normalized to sum 1), over the forwards that carry hints of `channel` (its own, never a
    stand-in's); None without them."""
    rows = trace._channel(channel)
    if not any(h is not None for h in rows) or trace.n_layers < 2:
        return None
    loads = trace.loads.numpy().astype(np.float64)
    hints = np.stack([h.numpy() if h is not None else np.zeros(loads.shape[1:], np.float32)
                      for h in rows]).astype(np.float64)
    prompts = np.array([s.prompt for s in trace.steps])
    mean = np.zeros_like(loads)
    for p in set(prompts.tolist()):
        mean[prompts == p] = loads[prompts == p].mean(0)

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.clip(x.sum(-1, keepdims=True), 1e-12, None)

    h, y, m = unit(hints[:, :-1]), unit(loads[:, 1:]), unit(mean[:, 1:])
    keep = (hints[:, :-1].sum(-1) > 0) & (loads[:, 1:].sum(-1) > 0)
    if not keep.any():
        return None
    d, t = (y - m)[keep].ravel(), (h - m)[keep].ravel()
    denom = float(d @ d)
    return float(np.clip(t @ d / denom, 0.0, 1.0)) if denom > 0 else None


def fit(trace: RoutingTrace, seed: int = 0, start: RoutingRegime | None = None,
        popularity: tuple[str, ...] = POPULARITY_SHAPES, also: tuple[str, ...] = (), average: int = 1
        ) -> tuple[RoutingRegime, dict[str, Any]]:
    """The regime whose generated traces (this trace's shape and geometry) match its
    statistics, and a record of the fit: target and reached statistics per knob. Each
    popularity shape of `popularity` is fitted; the one whose head share comes closer to the
    trace's is kept (among those whose misfit is not 4x the best). `also`: knobs of OPT_IN
    searched too. `average`: the statistics of that many generated traces (seeds seed, seed + 1,
    ...) averaged at each step (1: one trace, as before the option existed)."""
    if not popularity or any(p not in POPULARITY_SHAPES for p in popularity):
        raise HarnessError(f"popularity={','.join(popularity)!r}: give some of {', '.join(POPULARITY_SHAPES)}")
    unknown = [k for k in also if k not in OPT_IN]
    if unknown:
        raise HarnessError(f"also={unknown[0]!r} is no knob fit can search besides its own; use some of "
                           f"{', '.join(OPT_IN)}")
    search = {**SEARCH, **{k: OPT_IN[k] for k in also}}
    shape, dims = shape_of(trace), Dims.of_trace(trace)
    profile = trace_lag_profile(trace)
    period = period_of(profile)
    target = trace_moments(trace, period)
    if all(math.isnan(v) for v in target.values()):
        raise HarnessError("the trace has no decoding forwards to fit; give a trace of a decode")
    regime = replace(start or RoutingRegime(), period=float(period))
    q, q_residual = hint_quality(trace), hint_quality(trace, RESIDUAL)
    if q is not None:
        regime = replace(regime, hint_quality=q)
    if q_residual is not None:
        regime = replace(regime, residual_hint_quality=q_residual)
    knobs = [k for k in search if not math.isnan(target[k])]
    head = trace_head_share(trace, dims.top_k)
    shapes: dict[str, tuple[float, RoutingRegime, dict[str, float], float]] = {}
    # minutes on a long diffusion trace (mini: about 15 min CPU): the Newton iterations of every
    # shape and start, the misfit as it falls
    bar = tqdm(total=len([n for n in POPULARITY_SHAPES if n in popularity]) * 2 * ITERATIONS, desc="fit",
               unit="iteration", leave=False, dynamic_ncols=True, mininterval=1.0)
    for name, lognormal in zip(POPULARITY_SHAPES, (None, 1.0), strict=True):
        if name not in popularity:
            continue
        best = None
        overlap = ({"prefill_overlap": 1.0 if regime.prefill_overlap is None else regime.prefill_overlap}
                   if "prefill_overlap" in knobs else {})  # a start's unset knob: its meaning when unset
        first = replace(regime, lognormal=lognormal, **overlap)
        second = replace(SECOND_START, hint_quality=regime.hint_quality, period=regime.period,
                         residual_hint_quality=regime.residual_hint_quality, lognormal=lognormal,
                         **({"prefill_overlap": 0.5} if overlap else {}))
        if "unmasking" in knobs and start is None:
            first, second = (replace(r, **DENOISING_START) for r in (first, second))
        if "unmask_redraw" in knobs:  # a start without per-token unmasking: DENOISING_START's
            first, second = (r if r.unmask_redraw is not None else replace(r, unmask_redraw=0.5)
                             for r in (first, second))
        if "solo_locality" in knobs:  # a start without it: its meaning when unset, every slot at locality
            first, second = (r if r.solo_locality is not None else replace(r, solo_locality=r.locality)
                             for r in (first, second))
        if "mask_overlap" in knobs:  # unset: 1 (the decoding rankings); the second start halfway
            first = first if first.mask_overlap is not None else replace(first, mask_overlap=1.0)
            second = replace(second, mask_overlap=0.5)
        if "masked_locality" in knobs:  # a start without it: its meaning when unset, locality
            first, second = (r if r.masked_locality is not None else replace(r, masked_locality=r.locality)
                             for r in (first, second))
        for start_no, begin in enumerate((first, second)):  # the better of two starts
            bar.set_description(f"fit {name}, start {start_no + 1}/2")
            done = bar.n
            fitted, reached = _newton(begin, knobs, target, shape, dims, range(seed, seed + average), search,
                                      lambda m: _tick(bar, m))
            bar.update(done + ITERATIONS - bar.n)  # a start that converged early: its remaining iterations
            misfit = sum((reached[k] - target[k]) ** 2 for k in knobs if not math.isnan(reached[k]))
            if best is None or misfit < best[0]:
                best = (misfit, fitted, reached)
        shapes[name] = (*best, simulated_head_share(best[1], shape, dims, seed))
    bar.close()
    chosen = choose_shape({n: (v[0], v[3]) for n, v in shapes.items()}, head)
    _, regime, reached, _ = shapes[chosen]
    regime, sharpness = fit_hint_sharpness(trace, regime, shape, dims, seed)
    record = {"statistics": {k: {"target": _num(target[k]), "reached": _num(reached[k])} for k in target},
              "unfitted": [k for k in SEARCH if k not in knobs], "searched_also": list(also), "seed": seed,
              "averaged_over_seeds": average,
              "lag_profile": [_num(v) for v in profile], "period_from": "lag_profile",
              "hint_quality_from": "hints" if q is not None else "default (the trace has no hints)",
              "popularity": {"chosen": chosen, "head_share_target": _num(head),
                             **{f"head_share_{n}": _num(v[3]) for n, v in shapes.items()}},
              "residual_hint_quality_from": "residual_hints" if q_residual is not None
              else "unset (the trace has no residual hints: one predictor stands in for both channels)"}
    if sharpness is not None:
        record["statistics"]["hint_sharpness"] = sharpness
    return regime, record


SHARPNESS_BISECTIONS = 30


def fit_hint_sharpness(trace: RoutingTrace, regime: RoutingRegime, shape: TraceShape, dims: Dims, seed: int
                       ) -> tuple[RoutingRegime, dict[str, float | None] | None]:
    """`regime` with the hint_sharpness whose generated hints (of the channel DALI reads: the
    residual one where the trace has it) are as flat as the trace's, by bisection (the hints'
    entropy falls as the power rises); unchanged, and None, for a trace without hints."""
    channel, rows = dali_hint_rows(trace)
    if rows is None or trace.n_layers < 2:
        return regime, None
    target = hint_entropy(rows)
    sim = simulate(regime, shape, dims, seed)
    loads, expected = np.stack(sim.loads), np.stack(sim.expected)
    quality = regime.residual_hint_quality if channel == RESIDUAL and regime.residual_hint_quality is not None \
        else regime.hint_quality

    def entropy_at(power: float) -> float:
        return hint_entropy(predicted_loads(loads, sharpened(expected, power), quality))

    low, high = RANGES["hint_sharpness"]
    for _ in range(SHARPNESS_BISECTIONS):
        mid = (low + high) / 2
        low, high = (mid, high) if entropy_at(mid) > target else (low, mid)
    fitted = replace(regime, hint_sharpness=round((low + high) / 2, 4))
    _, got = dali_hint_rows(generate(fitted, shape, dims, seed))
    return fitted, {"target": _num(target), "reached": _num(hint_entropy(got) if got is not None else math.nan)}


def _newton(regime: RoutingRegime, knobs: list[str], target: dict[str, float], shape: TraceShape, dims: Dims,
            seeds: range, search: dict[str, tuple[bool, tuple[float, float]]],
            iterated: Callable[[float], object] = lambda misfit: None) -> tuple[RoutingRegime, dict[str, float]]:
    """Levenberg-Marquardt on the knobs, the Jacobian by finite differences (common random
    numbers), each step kept inside the knobs' brackets and taken only if it lowers the misfit;
    `iterated(misfit)` after each iteration (the progress bar)."""
    def at(x: np.ndarray) -> RoutingRegime:
        return replace(regime, **{k: float(np.clip(v, *search[k][1])) for k, v in zip(knobs, x, strict=True)})

    def residual(x: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        got = averaged_moments(at(x), shape, dims, seeds)
        r = np.array([got[k] - target[k] for k in knobs])
        return np.nan_to_num(r), got

    x = np.array([getattr(regime, k) for k in knobs], dtype=np.float64)
    r, got = residual(x)
    damping = 1e-3
    for _ in range(ITERATIONS):
        if np.abs(r).max() < TOLERANCE:
            break
        jac = np.zeros((len(knobs), len(knobs)))
        for j, k in enumerate(knobs):
            low, high = search[k][1]
            h = STEP * (high - low) * (1 if x[j] + STEP * (high - low) <= high else -1)
            xh = x.copy()
            xh[j] += h
            jac[:, j] = (residual(xh)[0] - r) / h
        grad, normal = jac.T @ r, jac.T @ jac
        for _try in range(6):  # Levenberg-Marquardt: a shorter, steeper step until the misfit falls
            step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-9), -grad)
            xn = np.array([np.clip(v, *search[k][1]) for k, v in zip(knobs, x + step, strict=True)])
            rn, gotn = residual(xn)
            if np.linalg.norm(rn) < np.linalg.norm(r):
                x, r, got, damping = xn, rn, gotn, damping / 3
                break
            damping *= 4
        else:
            break
        iterated(float(r @ r))
    return replace(at(x), **{k: round(float(getattr(at(x), k)), 4) for k in knobs}), got


def _tick(bar: tqdm, misfit: float) -> None:
    bar.update()
    bar.set_postfix(misfit=f"{misfit:.2e}")


def _num(v: float) -> float | None:
    return None if v is None or math.isnan(v) else round(float(v), 5)


def fit_file(trace: RoutingTrace, name: str, source: str, seed: int = 0,
             calibration: RoutingTrace | None = None, also: tuple[str, ...] = (), average: int = 1,
             popularity: tuple[str, ...] = POPULARITY_SHAPES) -> RegimeFile:
    """A regime file: the fitted knobs, the trace's shape and where the fit came from; with the
    calibration recorded beside the trace, also `calibration_shared` (harness/routing/calibration_fit.py)."""
    regime, record = fit(trace, seed, also=also, average=average, popularity=popularity)
    if calibration is not None:
        target = trace_calibration_overlap(trace, calibration)
        regime, record["statistics"]["calibration_shared"] = fit_calibration(
            regime, shape_of(trace), Dims.of_trace(trace), target, seed)
    meta = trace.meta
    return RegimeFile(regime, shape_of(trace), {
        "trace": source, "model": meta.get("model"), "routing": meta.get("routing", "recorded"),
        "weights": meta.get("weights"), "geometry": {"n_moe_layers": trace.n_layers, "num_experts": trace.n_experts},
        **record}, name)
