"""What `fit` matches: one statistic per routing knob, read from any trace's loads
(docs/routing-regimes.md), and the shape (`TraceShape`) of a recorded trace's forwards.

  skew          normalized entropy of each request's popularity over its decoding forwards
                (denoise or decode), mean over requests and layers (falls as skew rises)
  shared        Pearson correlation of two requests' decoding popularity, mean over pairs
                and layers (rises with shared)
  locality      share of a decoding forward's routed pairs that the forward before it (same
                request; same block for diffusion) routed to the same expert, sum of
                min(load, previous load) / sum of load (an autoregressive trace's
                temporal_locality), beyond chance: (share - c) / (1 - c), c the same share
                between forwards half the request apart
  decay         the same two forwards apart
                (with period 2, harness/routing/params.py: locality two forwards apart, decay four)
  affinity      cosine between a forward's layer l+1 load and its prediction from its layer
                l load through the layers' co-occurrence matrices, learnt on the even
                decoding forwards and scored on the odd ones, minus the cosine of the
                layer's popularity (the prediction without layer l)
  cohesion      normalized entropy of a decoding forward's load, mean over the forwards of
                more than one token and layers (falls as cohesion rises)
  unmasking     the same entropy over the denoising forwards after their block's first
                minus that over each block's first (rises with unmasking: the first step,
                all tokens masked, cohesive, the later ones diverse);
                nan without denoising forwards (autoregressive traces)
  prefill_skew  normalized entropy of each request's prefill popularity
  prefill_overlap  Pearson correlation of a request's prefill popularity with its decoding
                popularity, mean over requests and layers
  unmask_redraw the locality statistic LONG_LAG forwards apart, over denoising forwards of
                one block (falls as unmask_redraw rises: a block's long memory); nan
                without denoising forwards
  solo_locality the share of a denoising forward's experts with one token that the block's
                forward `period` later routes to again (kept_at_load 1); nan without
                denoising forwards
  mask_overlap  Pearson correlation of a request's popularity over its blocks' first
                denoising forwards (all tokens masked) with that over their last ones (nearly
                all unmasked), mean over requests and layers; nan without blocks of two steps
  masked_locality  the locality statistic between each block's first denoising forward and
                the one `period` after it (the tokens still masked but a few); nan without
                denoising forwards
"""

from __future__ import annotations

import math

import numpy as np

from harness.common.errors import HarnessError
from harness.model.hints import NEXT_GATE, RESIDUAL
from harness.placement.trace import RoutingTrace
from harness.routing.params import TraceShape
from harness.traces.serving import PER_PROMPT_TOKENS

MOMENTS = ("skew", "shared", "locality", "decay", "affinity", "cohesion", "unmasking", "prefill_skew",
           "prefill_overlap", "unmask_redraw", "solo_locality", "mask_overlap", "masked_locality")
LONG_LAG = 8  # unmask_redraw's statistic: the overlap this many forwards (x period) apart


def _entropy(pop: np.ndarray) -> float:
    total = pop.sum(-1)
    keep = total > 0
    if not keep.any():
        return math.nan
    p = pop[keep] / total[keep][:, None]
    h = -(p * np.log(np.clip(p, 1e-30, None))).sum(-1)
    return float((h / math.log(pop.shape[-1])).mean())


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.int64), b.astype(np.int64)
    return float(np.minimum(a, b).sum() / max(1, a.sum()))


def _lag_overlap(loads: np.ndarray, prompts: np.ndarray, blocks: np.ndarray, decoding: np.ndarray,
                 ar: np.ndarray, lag: int, earlier: np.ndarray | None = None) -> float:
    """Overlap `lag` forwards apart beyond chance: (overlap - chance) / (1 - chance), chance
    the overlap of each decoding forward with one half a request's decoding away (order lost,
    popularity kept); `earlier` given, only from the forwards it marks."""
    if len(loads) <= lag:
        return math.nan
    ok = decoding[lag:] & decoding[:-lag] & (prompts[lag:] == prompts[:-lag]) \
        & (ar[lag:] | (blocks[lag:] == blocks[:-lag]))
    if earlier is not None:
        ok &= earlier[:-lag]
    if not ok.any():
        return math.nan
    near = _overlap(loads[lag:][ok], loads[:-lag][ok])
    pairs = []
    for p in np.unique(prompts[decoding]):
        rows = np.flatnonzero(decoding & (prompts == p))
        pairs.append(np.stack([rows, np.roll(rows, len(rows) // 2)]))
    a, b = np.concatenate(pairs, axis=1)
    chance = _overlap(loads[a], loads[b])
    return (near - chance) / (1 - chance) if chance < 1 else math.nan


def kept_at_load(now: np.ndarray, after: np.ndarray, load: int) -> float:
    """Share of the (forward, layer, expert) entries of `now` [S, L, E] with exactly `load`
    tokens whose expert `after` (the same tokens' later forwards, row by row) routes to again;
    nan without any."""
    at = now == load
    seen = int(at.sum())
    return int((at & (after > 0)).sum()) / seen if seen else math.nan


def _solo_kept(loads: np.ndarray, prompts: np.ndarray, blocks: np.ndarray, denoise: np.ndarray, lag: int) -> float:
    if len(loads) <= lag:
        return math.nan
    ok = denoise[lag:] & denoise[:-lag] & (prompts[lag:] == prompts[:-lag]) & (blocks[lag:] == blocks[:-lag])
    return kept_at_load(loads[:-lag][ok], loads[lag:][ok], 1) if ok.any() else math.nan


def _affinity(loads: np.ndarray) -> float:
    """Cosine of the co-occurrence prediction of layer l+1 beyond the popularity prediction."""
    if loads.shape[0] < 2 or loads.shape[1] < 2:
        return math.nan
    x = loads.astype(np.float32)
    train, test = x[0::2], x[1::2]
    co = np.einsum("sle,slf->lef", train[:, :-1], train[:, 1:])  # [L-1, E, E]
    co /= np.clip(co.sum(-1, keepdims=True), 1e-9, None)
    actual = test[:, 1:]

    def cosine(pred: np.ndarray) -> float:
        num = (pred * actual).sum(-1)
        den = np.linalg.norm(pred, axis=-1) * np.linalg.norm(actual, axis=-1)
        ok = den > 0
        return float((num[ok] / den[ok]).mean()) if ok.any() else math.nan

    popular = np.broadcast_to(train[:, 1:].sum(0), actual.shape)
    return cosine(np.einsum("sle,lef->slf", test[:, :-1], co)) - cosine(popular)


def _block_ends(denoise: np.ndarray, prompt: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bool [S] each: the forwards that are a block's first denoising step, and its last, of
    the blocks with at least two (forwards in order)."""
    first, last = np.zeros(len(denoise), dtype=bool), np.zeros(len(denoise), dtype=bool)
    by_block: dict[tuple[int, int], list[int]] = {}
    for i in np.flatnonzero(denoise):
        by_block.setdefault((int(prompt[i]), int(block[i])), []).append(int(i))
    for steps in by_block.values():
        if len(steps) > 1:
            first[steps[0]], last[steps[-1]] = True, True
    return first, last


def _unmasking(loads: np.ndarray, kind: np.ndarray, prompt: np.ndarray, block: np.ndarray,
               tokens: np.ndarray) -> float:
    """Entropy of each block's denoising forwards after its first minus the first's."""
    rows = np.flatnonzero((kind == "denoise") & (tokens > 1))
    keys = list(zip(prompt[rows].tolist(), block[rows].tolist(), strict=True))
    first = np.zeros(len(rows), dtype=bool)
    seen: set[tuple[int, int]] = set()
    for i, key in enumerate(keys):  # forwards in order: a block's first step is its first seen
        first[i] = key not in seen
        seen.add(key)
    late = ~first
    if not late.any():
        return math.nan
    E = loads.shape[-1]
    return _entropy(loads[rows[late]].reshape(-1, E)) - _entropy(loads[rows[first]].reshape(-1, E))


def _mask_overlap(loads: np.ndarray, prompt: np.ndarray, first: np.ndarray, last: np.ndarray) -> float:
    """Correlation of each request's first-step popularity with its last-step one."""
    if not last.any():
        return math.nan
    ids = sorted(set(prompt[last].tolist()))
    pops = [np.stack([loads[rows & (prompt == p)].sum(0) for p in ids]).astype(np.float64) for rows in (first, last)]
    return _paired_correlation(*pops)


PERIOD_MARGIN = 0.02  # how much more the overlap two forwards apart must be for period 2


def lag_profile(loads: np.ndarray, kinds: list[str], prompts: list[int], blocks: list[int],
                lags: int = 4) -> list[float]:
    """The overlap beyond chance 1..lags forwards apart (the locality statistic at each lag)."""
    kind = np.array(kinds)
    decoding = (kind == "denoise") | (kind == "decode")
    return [_lag_overlap(loads, np.array(prompts), np.array(blocks), decoding, kind == "decode", lag)
            for lag in range(1, lags + 1)]


def period_of(profile: list[float]) -> int:
    """2 when the overlap two forwards apart beats the neighbour's and four apart beats three
    (a decode alternating between two states), else 1."""
    o1, o2, o3, o4 = (v if not math.isnan(v) else 0.0 for v in profile[:4])
    return 2 if o2 > o1 + PERIOD_MARGIN and o4 > o3 + PERIOD_MARGIN else 1


def moments(loads: np.ndarray, kinds: list[str], prompts: list[int], blocks: list[int],
            tokens: list[int], period: int = 1) -> dict[str, float]:
    """The statistics of the module docstring for loads [S, L, E] and each forward's kind,
    request and block; locality and decay `period` and 2 x `period` forwards apart."""
    kind = np.array(kinds)
    decoding = (kind == "denoise") | (kind == "decode")
    ar = kind == "decode"
    prompt = np.array(prompts)
    ids = sorted(set(prompts))
    pop, pre_pop = request_popularity(loads, kinds, prompts)
    z = _unit_rows(pop)
    shared = math.nan
    if len(ids) > 1:
        corr = np.einsum("rle,sle->lrs", z, z)
        off = corr[:, ~np.eye(len(ids), dtype=bool)]
        shared = float(np.nanmean(off)) if np.isfinite(off).any() else math.nan
    block = np.array(blocks)
    denoise = kind == "denoise"
    first, last = _block_ends(denoise, prompt, block)
    return {
        "skew": _entropy(pop.reshape(-1, pop.shape[-1])),
        "shared": shared,
        "locality": _lag_overlap(loads, prompt, block, decoding, ar, period),
        "decay": _lag_overlap(loads, prompt, block, decoding, ar, 2 * period),
        "affinity": _affinity(loads[decoding]),
        "cohesion": _entropy(loads[decoding & (np.array(tokens) > 1)].reshape(-1, loads.shape[-1])),
        "unmasking": _unmasking(loads, kind, prompt, block, np.array(tokens)),
        "prefill_skew": _entropy(pre_pop.reshape(-1, pre_pop.shape[-1])) if (kind == "prefill").any() else math.nan,
        "prefill_overlap": _paired_correlation(pre_pop, pop),
        "unmask_redraw": _lag_overlap(loads, prompt, block, denoise, ar, LONG_LAG * period),
        "solo_locality": _solo_kept(loads, prompt, block, denoise, period),
        "mask_overlap": _mask_overlap(loads, prompt, first, last),
        "masked_locality": _lag_overlap(loads, prompt, block, denoise, ar, period, first)
        if denoise.any() else math.nan,
    }


def request_popularity(loads: np.ndarray, kinds: list[str], prompts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """float64 [R, L, E] each: per request (in id order) its decoding forwards' summed loads
    and its prefill's (zeros for a request without one)."""
    kind, prompt = np.array(kinds), np.array(prompts)
    decoding = (kind == "denoise") | (kind == "decode")
    ids = sorted(set(prompts))
    pop = np.stack([loads[decoding & (prompt == p)].sum(0) for p in ids]).astype(np.float64)
    pre = np.stack([loads[(kind == "prefill") & (prompt == p)].sum(0) for p in ids]).astype(np.float64)
    return pop, pre


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row centred and scaled to norm 1 (nan where it is constant: no correlation)."""
    z = x - x.mean(-1, keepdims=True)
    norm = np.linalg.norm(z, axis=-1, keepdims=True)
    return np.where(norm > 0, z / np.clip(norm, 1e-30, None), np.nan)


def _paired_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """prefill_overlap: Pearson correlation of a[r, l] with b[r, l] over the experts, mean over
    the (request, layer) pairs where both vary (nan where none does: no prefills)."""
    corr = (_unit_rows(a) * _unit_rows(b)).sum(-1)
    return float(np.nanmean(corr)) if np.isfinite(corr).any() else math.nan


def hint_entropy(hints: np.ndarray) -> float:
    """Normalized entropy of a hint channel's rows [S, L, E] (row l predicts layer l + 1; the
    last predicts nothing), mean over the rows that predict something: how flat the hint is
    (what `hint_sharpness` matches; no knob of `moments`)."""
    rows = hints[:, :-1].reshape(-1, hints.shape[-1]).astype(np.float64)
    return _entropy(np.clip(rows, 0.0, None))


def dali_hint_rows(trace: RoutingTrace) -> tuple[str, np.ndarray | None]:
    """The hint channel DALI reads by default (the residual one where the trace has its own,
    else next_gate) and that channel's own rows [S', L, E] (never a stand-in's; None without)."""
    channel = RESIDUAL if any(h is not None for h in trace._channel(RESIDUAL)) else NEXT_GATE
    rows = [h.numpy() for h in trace._channel(channel) if h is not None]
    return channel, np.stack(rows) if rows else None


def head_share(pop: np.ndarray, k: int) -> float:
    """The share of a request's decoding pairs on its k most used experts at a layer, mean over
    requests and layers, for pop [R, L, E] (`request_popularity`): how heavy the popularity's
    head is at a given entropy (what chooses the popularity's shape, Zipf or log-normal, in
    `fit`; no knob's statistic)."""
    total = pop.sum(-1)
    top = -np.sort(-pop, axis=-1)[..., :k].sum(-1)
    keep = total > 0
    return float((top[keep] / total[keep]).mean()) if keep.any() else math.nan


def trace_head_share(trace: RoutingTrace, k: int) -> float:
    pop, _ = request_popularity(trace.loads.numpy(), [s.kind for s in trace.steps], [s.prompt for s in trace.steps])
    return head_share(pop, k)


def trace_moments(trace: RoutingTrace, period: int = 1) -> dict[str, float]:
    return moments(trace.loads.numpy(), [s.kind for s in trace.steps], [s.prompt for s in trace.steps],
                   [s.block for s in trace.steps], trace.n_tokens, period)


def trace_lag_profile(trace: RoutingTrace) -> list[float]:
    return lag_profile(trace.loads.numpy(), [s.kind for s in trace.steps], [s.prompt for s in trace.steps],
                       [s.block for s in trace.steps])


def shape_of(trace: RoutingTrace) -> TraceShape:
    """The forwards of a recorded (or imported, or generated) trace as a TraceShape: its
    requests' prompt and generated tokens and, for block diffusion, the steps each block took."""
    kinds = {s.kind for s in trace.steps}
    prompts = sorted({s.prompt for s in trace.steps})
    decode = trace.meta.get("decode") if isinstance(trace.meta.get("decode"), dict) else {}
    per_prompt = trace.meta.get(PER_PROMPT_TOKENS)
    block = int(decode.get("block_length", 32))
    prompt_tokens, gen_tokens, steps = [], [], []
    for i, p in enumerate(prompts):
        rows = [j for j, s in enumerate(trace.steps) if s.prompt == p]
        prefill = [j for j in rows if trace.steps[j].kind == "prefill"]
        if "decode" in kinds:
            d = sum(trace.steps[j].kind == "decode" for j in rows)
            prompt_tokens.append(trace.n_tokens[prefill[0]] if prefill else 0)
            gen_tokens.append(d + 1 if prefill else d)
            continue
        denoise = [trace.steps[j] for j in rows if trace.steps[j].kind == "denoise"]
        if not denoise:
            raise HarnessError(f"trace request {p} has no decoding forwards; nothing to fit or mirror")
        per_block: dict[int, int] = {}
        for s in denoise:
            per_block[s.block] = per_block.get(s.block, 0) + 1
        steps.append([per_block[b] for b in sorted(per_block)])
        first = min(per_block)
        canvas = "canvas" if trace.meta.get("model") == "diffusiongemma" else "block"
        prompt_tokens.append(trace.n_tokens[prefill[0]] if prefill and canvas == "canvas" else first * block)
        total = trace.meta.get("generated_tokens")
        tokens = per_prompt[i] if isinstance(per_prompt, list) and i < len(per_prompt) else \
            total // len(prompts) if isinstance(total, int) and total > 0 else block * len(per_block)
        gen_tokens.append(int(tokens))
    if "decode" in kinds:
        return TraceShape("ar", prompt_tokens, gen_tokens, block)
    mode = "canvas" if trace.meta.get("model") == "diffusiongemma" else "block"
    cache = "none" if decode.get("cache") == "none" else "prefix"
    return TraceShape(mode, prompt_tokens, gen_tokens, block, steps, cache)
