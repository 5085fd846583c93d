"""Generated routing: a `RoutingRegime` over a `TraceShape` as a trace in the harness's format
(harness/placement/trace.py), for any MoE geometry (docs/routing-regimes.md).

Each token picks top-k distinct experts per MoE layer by Gumbel-top-k over its request's
popularity (a Zipf or log-normal ranking mixed from a shared and a per-request one, harness/routing/params.py),
after forced slots (and, with `unmask_redraw`, per-token redraws):

  reuse     each slot with probability `locality` takes an expert (a distinct slot of) the same token used one
            denoising step earlier (block diffusion: the window's tokens persist across steps)
            or an earlier token used (autoregressive), the lag d drawn with weight decay^(d-1)
            (d x `period` tokens/steps back); with `solo_locality` set, a diffusion slot whose
            expert had that token alone at the source step with that probability instead
  affinity  each slot with probability `affinity` takes the expert a fixed random map of
            layer l assigns to one of the token's layer-l experts (at layer l + 1)

  cohesion  each slot with probability `cohesion` takes an expert of the forward's anchor
            set (k experts drawn once per forward and layer; forwards of several tokens),
            at a block's denoising step s the probability cohesion x (1 - unmasking x
            (1 - 2^-s)) (the prompt, never masked, as at step `block`; no extra draws: the
            same numbers compared with a lower probability); with `unmask_redraw` set, per
            token: cohesion while the token is masked, cohesion x (1 - unmasking) once it is
  redraw    with `unmask_redraw` set, each token of a block is unmasked at a step drawn
            uniformly over the block's steps; at the first forward after it, with probability
            unmask_redraw, the token reuses nothing and from then on only what it routed since
  masked    with `mask_overlap` set, a still-masked token draws (and the anchor set is drawn)
            from the masked state's popularity instead of the decoding one; with
            `masked_locality` set, a still-masked token's slots reuse with that probability

The hints: each channel q x layer l+1's true load + (1 - q) x its expectation under the
request's popularity (raised to `hint_sharpness` when that is set).

Reuses win over cohesion, cohesion over affinity picks, and these over fresh draws. The forwards are the ones the
decode loops run (harness/decode/decoding.py, harness/zoo/ar_generate.py,
harness/zoo/diffusiongemma_generate.py), numbered as they number them; `cache=none` traces are
built from the prefix-cached ones as a recording's are (`derive_no_cache`). Everything is
seeded (numpy's Generator): the same regime, shape and seed give the same trace, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace, derive_no_cache
from harness.routing.params import MAX_LAG, RoutingRegime, TraceShape
from harness.traces.importing import model_geometry
from harness.traces.routing_stats import top_k_of
from harness.traces.serving import PER_PROMPT_TOKENS

FORCED_REUSE, FORCED_COHESION, FORCED_AFFINITY = 1e6, 1e4, 1e2  # added to forced experts' scores, in precedence
PREFILL_STREAM = 1  # the prefill's own rankings come from Generator((seed, PREFILL_STREAM))
UNMASK_STREAM = 2  # the tokens' unmask steps and redraws come from Generator((seed, UNMASK_STREAM))
MASK_STREAM = 3  # the masked state's own rankings (`mask_overlap`) come from Generator((seed, MASK_STREAM))
NO_REDRAW = 1 << 30  # `Unmasked.since` of a token that has not redrawn: all its history usable
UNMASKED_PER_STEP = 0.5  # share of a block's still-masked tokens each denoising step leaves masked


@dataclass(frozen=True)
class Dims:
    """The routing shape of a model: MoE layers, experts, top-k, and the geometry a trace stores."""

    n_layers: int
    n_experts: int
    top_k: int
    geometry: dict[str, Any] = field(default_factory=dict)
    model: str = "?"

    @classmethod
    def of_trace(cls, trace: RoutingTrace) -> Dims:
        return cls(trace.n_layers, trace.n_experts, top_k_of(trace), dict(trace.geometry),
                   str(trace.meta.get("model", "?")))

    @classmethod
    def of_model(cls, model: str, config: str | None = None) -> Dims:
        geometry, _ = model_geometry(model, config)
        return cls(geometry.n_moe_layers, geometry.num_experts, geometry.num_experts_per_tok, geometry.to_dict(),
                   model)


def zipf(n: int, s: float) -> np.ndarray:
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    return w / w.sum()


@cache
def _normal_quantiles(n: int) -> np.ndarray:
    """z_i of ranks 0..n-1, heaviest first, shifted so z_0 = 0 (every Router asks for the same n)."""
    normal = NormalDist()
    z = np.array([normal.inv_cdf((n - i - 0.5) / n) for i in range(n)])
    z = z - z[0]
    z.flags.writeable = False
    return z


def lognormal_ranks(n: int, sigma: float) -> np.ndarray:
    """Weights exp(sigma x z_i), z_i the standard normal quantile of rank i (heaviest first)."""
    w = np.exp(sigma * _normal_quantiles(n))
    return w / w.sum()


def popularity_weights(n: int, skew: float, lognormal: bool) -> np.ndarray:
    """The popularity of ranks 0..n-1 (heaviest first): Zipf, or log-normal (params.py `lognormal`)."""
    return lognormal_ranks(n, skew) if lognormal else zipf(n, skew)


@dataclass(frozen=True)
class Unmasked:
    """The tokens of one denoising forward under per-token unmasking (`unmask_redraw`):
    `masked` [n] whether each is still masked, `since` [n] the forwards since it redrew
    (0: this one, it reuses nothing; NO_REDRAW: it did not)."""

    masked: np.ndarray
    since: np.ndarray


class Router:
    """The per-request popularity, the cross-layer maps and the seeded draws of one trace."""

    def __init__(self, regime: RoutingRegime, dims: Dims, n_requests: int, seed: int, calibration: int = 0) -> None:
        self.regime, self.dims = regime, dims
        self.rng = np.random.default_rng(seed)
        L, E = dims.n_layers, dims.n_experts
        glob = self._ranks((L, E))
        own = self._ranks((n_requests, L, E))
        self.maps = self._ranks((L, E))  # layer l's expert e -> layer l+1's maps[l, e]

        workload = n_requests - calibration
        shares = {regime.shared_of(r, workload) for r in range(n_requests)}

        def mixed(w: np.ndarray, glob: np.ndarray, own: np.ndarray) -> np.ndarray:
            if len(shares) == 1:  # one share for every request (the calibration's unset or equal)
                return regime.shared * w[glob][None] + (1 - regime.shared) * w[own]
            # the last `calibration` requests at calibration_shared
            share = np.array([regime.shared_of(r, workload) for r in range(n_requests)])[:, None, None]
            return share * w[glob][None] + (1 - share) * w[own]

        def popularity(s: float) -> np.ndarray:
            return np.log(mixed(popularity_weights(E, s, bool(regime.lognormal)), glob, own)).astype(np.float32)

        def apart(s: float, overlap: float, stream: int) -> np.ndarray:
            """overlap x the decoding rankings' popularity + (1 - overlap) x rankings of its own,
            from a generator of their own: the routing's draws stay as they were."""
            w = popularity_weights(E, s, bool(regime.lognormal))
            ranks = np.random.default_rng((seed, stream))
            own_glob = ranks.permuted(np.broadcast_to(np.arange(E), (L, E)).copy(), axis=-1)
            own_req = ranks.permuted(np.broadcast_to(np.arange(E), (n_requests, L, E)).copy(), axis=-1)
            both = overlap * mixed(w, glob, own) + (1 - overlap) * mixed(w, own_glob, own_req)
            return np.log(both).astype(np.float32)

        self.decode_logp = popularity(regime.skew)
        self.prefill_logp = popularity(regime.prefill_skew) if regime.prefill_overlap is None \
            else apart(regime.prefill_skew, regime.prefill_overlap, PREFILL_STREAM)
        mask = regime.mask_overlap  # the masked state's popularity; None: the decoding one
        self.masked_logp = None if mask is None else apart(regime.skew, mask, MASK_STREAM)
        lags = regime.decay ** np.arange(MAX_LAG)
        self.lag_weights = [lags[:n] / lags[:n].sum() for n in range(1, MAX_LAG + 1)]
        self.period = int(regime.period)
        self.memory = MAX_LAG * self.period  # the earlier tokens/steps a reuse may come from
        self.unmask_rng = None if regime.unmask_redraw is None else np.random.default_rng((seed, UNMASK_STREAM))

    def _reuse_probability(self, stacked: np.ndarray, lag: np.ndarray, cand: np.ndarray, same_tokens: bool,
                           unmasked: Unmasked | None) -> float | np.ndarray:
        """Per slot: `locality`, or `solo_locality` where the expert it would reuse had only
        that token at the source step, or `masked_locality` for a token still masked (the same
        random numbers either way: unset, or equal to locality, is the trace bit for bit)."""
        regime = self.regime
        prob: float | np.ndarray = regime.locality
        if regime.solo_locality is not None and same_tokens:
            D, n, L, k = stacked.shape
            E = self.dims.n_experts
            loads = counts(stacked.transpose(1, 0, 2, 3).reshape(n, D * L, k), E).reshape(D, L, E)
            solo = loads[lag, np.arange(L)[None, :, None], cand] == 1
            prob = np.where(solo, regime.solo_locality, regime.locality)
        if regime.masked_locality is not None and unmasked is not None:
            prob = np.where(unmasked.masked[:, None, None], regime.masked_locality, prob)
        return prob

    def _ranks(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.permuted(np.broadcast_to(np.arange(shape[-1]), shape).copy(), axis=-1)

    def unmask_schedule(self, n: int, steps: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Per token of a block of `steps` steps: the step at whose end it is unmasked, and
        whether it redraws then (None without `unmask_redraw`)."""
        if self.unmask_rng is None:
            return None
        return (self.unmask_rng.integers(steps, size=n),
                self.unmask_rng.random(n) < float(self.regime.unmask_redraw or 0.0))

    def route(self, logp: np.ndarray, n: int, sources: list[np.ndarray], step: int = 0,
              unmasked: Unmasked | None = None, same_tokens: bool = False,
              masked_logp: np.ndarray | None = None) -> np.ndarray:
        """int64 [n, L, k]: n tokens' experts; logp [L, E] (every token's) or [n, L, E];
        sources: each token's experts at the earlier steps, newest first ([n, L, k] each);
        step: the forward's denoising step in its block (cohesion fades by `unmasking`);
        unmasked: the tokens' states under per-token unmasking (else the step schedule);
        same_tokens: the sources are these tokens' earlier forwards (a diffusion block), so
        an expert's count among them is its load there (`solo_locality`);
        masked_logp: [L, E], the masked state's popularity (`mask_overlap`): the still-masked
        tokens' and the anchor set's under per-token unmasking."""
        k, (L, E) = self.dims.top_k, logp.shape[-2:]
        rng, regime = self.rng, self.regime
        anchor_logp = logp if logp.ndim == 2 else logp[0]
        if masked_logp is not None and unmasked is not None:  # masked tokens (and the anchor) by the masked state's
            anchor_logp = masked_logp
            logp = np.where(unmasked.masked[:, None, None], masked_logp[None], logp if logp.ndim == 3 else logp[None])
        u = rng.random((n, L, E), dtype=np.float32)
        scores = (logp if logp.ndim == 3 else logp[None]) - np.log(-np.log(np.clip(u, 1e-12, 1 - 1e-7)))
        avail = sources[self.period - 1::self.period][:MAX_LAG]
        if avail and regime.locality > 0:
            lag = rng.choice(len(avail), size=(n, L, k), p=self.lag_weights[len(avail) - 1])
            # slot j reuses slot perm(j) of the earlier token/step: distinct slots, so at locality
            # near 1 a token keeps nearly all its k experts (a diffusion step re-routing the same tokens)
            slot = rng.permuted(np.broadcast_to(np.arange(k), (n, L, k)).copy(), axis=-1)
            if unmasked is not None:  # a redrawn token reuses only what it routed since
                usable = unmasked.since // self.period  # its sources at or after the redraw
                lag = np.minimum(lag, np.maximum(usable - 1, 0)[:, None, None])
            stacked = np.stack(avail)  # [D, n, L, k]
            cand = stacked[lag, np.arange(n)[:, None, None], np.arange(L)[None, :, None], slot]
            keep = rng.random((n, L, k)) < self._reuse_probability(stacked, lag, cand, same_tokens, unmasked)
            if unmasked is not None:
                keep &= (usable >= 1)[:, None, None]
            scores = _force(scores, cand, keep, FORCED_REUSE)
        if n > 1 and regime.cohesion > 0:  # the forward's anchor set, shared by its tokens
            g = -np.log(-np.log(np.clip(rng.random((L, E), dtype=np.float32), 1e-12, 1 - 1e-7)))
            anchor = _top_k(anchor_logp + g, k)  # [L, k]
            slot = rng.integers(k, size=(n, L, k))
            cand = np.take_along_axis(np.broadcast_to(anchor[None], (n, L, k)), slot, -1)
            if unmasked is None:  # the share of the block's tokens unmasked by step `step`
                share: float | np.ndarray = 1.0 - UNMASKED_PER_STEP ** step
            else:  # each token's own state
                share = (~unmasked.masked).astype(np.float64)[:, None, None]
            keep = rng.random((n, L, k)) < regime.cohesion * (1.0 - regime.unmasking * share)
            scores = _force(scores, cand, keep, FORCED_COHESION)
        if regime.affinity <= 0 or L == 1:
            return _top_k(scores, k)
        out = np.empty((n, L, k), dtype=np.int64)
        out[:, 0] = _top_k(scores[:, 0], k)
        kept = rng.random((L - 1, n, k)) < regime.affinity  # the numbers one draw per layer would give
        for layer in range(1, L):
            cand = self.maps[layer - 1][out[:, layer - 1]]  # [n, k]
            out[:, layer] = _top_k(_force(scores[:, layer], cand, kept[layer - 1], FORCED_AFFINITY), k)
        return out


def _force(scores: np.ndarray, cand: np.ndarray, keep: np.ndarray, bonus: float) -> np.ndarray:
    """scores with `bonus` added at the kept candidates (a candidate listed twice once: a
    fancy-indexed add writes each place once); the fit's inner loop, so plain indexing."""
    where = np.nonzero(keep)
    at = (*where[:-1], cand[where])
    out = scores.copy()
    out[at] = out[at] + np.float32(bonus)
    return out


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argpartition(-scores, k - 1, axis=-1)[..., :k]


def counts(ids: np.ndarray, n_experts: int) -> np.ndarray:
    """int32 [L, E]: experts' token counts of ids [n, L, k]."""
    L = ids.shape[1]
    flat = (ids + (np.arange(L) * n_experts)[None, :, None]).reshape(-1)
    return np.bincount(flat, minlength=L * n_experts).reshape(L, n_experts).astype(np.int32)


@dataclass
class Simulated:
    """A generated trace before it is a RoutingTrace: forwards, loads, expected loads."""

    steps: list[tuple[StepInfo, int, int]] = field(default_factory=list)
    loads: list[np.ndarray] = field(default_factory=list)  # [L, E] per forward
    expected: list[np.ndarray] = field(default_factory=list)  # [L, E] per forward (for hints)

    def add(self, info: StepInfo, tokens: int, context: int, ids: np.ndarray, logp: np.ndarray,
            dims: Dims) -> None:
        self.steps.append((info, tokens, context))
        self.loads.append(counts(ids, dims.n_experts))
        self.expected.append(np.exp(logp) * (len(ids) * dims.top_k))


def simulate(regime: RoutingRegime, shape: TraceShape, dims: Dims, seed: int = 0, calibration: int = 0) -> Simulated:
    """The forwards of every request in order, each with its loads (module docstring); the
    last `calibration` requests at the regime's `calibration_shared`."""
    router = Router(regime, dims, shape.requests, seed, calibration)
    sim = Simulated()
    if shape.mode == "ar":
        _autoregressive(router, shape, sim)
    else:
        for r in range(shape.requests):
            _diffusion(router, shape, r, sim)
    return sim


def _autoregressive(router: Router, shape: TraceShape, sim: Simulated) -> None:
    """Per request a prefill over its P tokens, then G - 1 decode forwards of one token each,
    all requests' decode tokens drawn together (each request's own history)."""
    dims = router.dims
    decoded = [g - 1 if p else g for p, g in zip(shape.prompt_tokens, shape.gen_tokens, strict=True)]
    longest = max(decoded)
    tails: list[list[np.ndarray]] = []
    prefills = []
    for r, p in enumerate(shape.prompt_tokens):
        ids = router.route(router.prefill_logp[r], p, []) if p else None
        prefills.append(ids)
        tails.append([ids[p - 1 - j][None] for j in range(min(p, router.memory))] if ids is not None else [])
    history = [np.concatenate([t[j] if j < len(t) else t[-1] for t in tails]) for j in range(router.memory)] \
        if all(tails) else []  # a request without a prompt starts without history
    drawn = []
    for _ in range(longest):  # token d of every request at once
        ids = router.route(router.decode_logp, shape.requests, history)  # [R, L, k]
        drawn.append(ids)
        history = [ids, *history[:router.memory - 1]]
    for r, (p, d_count) in enumerate(zip(shape.prompt_tokens, decoded, strict=True)):
        if p:
            sim.add(StepInfo(r, 0, 0, len(sim.steps), True, "prefill"), p, p, prefills[r], router.prefill_logp[r],
                    dims)
        for d in range(d_count):
            block = d // shape.block
            sim.add(StepInfo(r, block, d % shape.block, len(sim.steps), block == 0, "decode"), 1, p + d + 1,
                    drawn[d][r:r + 1], router.decode_logp[r], dims)


def _diffusion(router: Router, shape: TraceShape, r: int, sim: Simulated) -> None:
    """One request's forwards in LLaDA2's block loop or DiffusionGemma's canvas loop."""
    dims, lb = router.dims, shape.block
    p = shape.prompt_tokens[r]
    first = shape.first_block(r)
    encoded = 0
    if shape.mode == "block" and first > 0:
        n = first * lb
        sim.add(StepInfo(r, first, 0, len(sim.steps), True, "prefill"), n, n,
                router.route(router.prefill_logp[r], n, [], lb), router.prefill_logp[r], dims)
        encoded = n
    elif shape.mode == "canvas":
        sim.add(StepInfo(r, 0, 0, len(sim.steps), True, "prefill"), p, p,
                router.route(router.prefill_logp[r], p, [], lb), router.prefill_logp[r], dims)
        encoded = p
    n_blocks = shape.n_blocks(r)
    masked = None if router.masked_logp is None else router.masked_logp[r]
    for i, steps in enumerate(shape.steps[r]):
        block = first + i if shape.mode == "block" else i
        history: list[np.ndarray] = []
        schedule = router.unmask_schedule(lb, steps)
        for s in range(steps):
            states = _states(schedule, s)
            ids = router.route(router.decode_logp[r], lb, history, s, states, True, masked)
            history = [ids, *history[:router.memory - 1]]
            sim.add(StepInfo(r, block, s, len(sim.steps), i == 0, "denoise"), lb, encoded + lb, ids,
                    _routed_from(router.decode_logp[r], masked, states), dims)
        if i + 1 < n_blocks:  # the finished block's commit: its tokens one step on
            states = _states(schedule, steps)
            ids = router.route(router.decode_logp[r], lb, history, steps, states, True, masked)
            sim.add(StepInfo(r, block, steps, len(sim.steps), i == 0, "commit"), lb, encoded + lb, ids,
                    _routed_from(router.decode_logp[r], masked, states), dims)
            encoded += lb


def _routed_from(decode: np.ndarray, masked: np.ndarray | None, states: Unmasked | None) -> np.ndarray:
    """[L, E]: the popularity the forward's tokens drew from, for its hints' expected loads: the
    decoding one, or with `mask_overlap` the mix of the masked state's (its still-masked tokens'
    share) and the decoding one (the hints predict what the window routes, as a model's gates
    do, not what it will route unmasked)."""
    if masked is None or states is None:
        return decode
    share = float(states.masked.mean())
    return np.log(share * np.exp(masked) + (1 - share) * np.exp(decode)).astype(np.float32)


def _states(schedule: tuple[np.ndarray, np.ndarray] | None, step: int) -> Unmasked | None:
    """The tokens' states at denoising step `step` (the commit at step = the block's steps) of a
    block whose tokens are unmasked at the end of steps `schedule[0]` and redraw per `schedule[1]`."""
    if schedule is None:
        return None
    unmask_step, redraws = schedule
    seen = step - (unmask_step + 1)  # forwards since the first that sees the token unmasked
    return Unmasked(step <= unmask_step, np.where(redraws & (seen >= 0), seen, NO_REDRAW))


def generate(regime: RoutingRegime, shape: TraceShape, dims: Dims, seed: int = 0, name: str = "",
             calibration: int = 0) -> RoutingTrace:
    """The trace of `simulate`, with hints, geometry and the meta a replay reads; its meta
    says `routing: generated` and holds the regime (name and knobs) and the seed."""
    sim = simulate(regime, shape, dims, seed, calibration)
    loads = np.stack(sim.loads)
    expected = np.stack(sim.expected).astype(np.float32)
    if regime.hint_sharpness is not None:
        expected = sharpened(expected, regime.hint_sharpness)
    hints = predicted_loads(loads, expected, regime.hint_quality)
    residual = None if regime.residual_hint_quality is None else \
        predicted_loads(loads, expected, regime.residual_hint_quality)
    trace = RoutingTrace(dims.n_layers, dims.n_experts, geometry=dict(dims.geometry))
    for s, (info, tokens, context) in enumerate(sim.steps):
        trace.add_step(info, tokens, context)
        trace.set_step(s, loads[s], hints[s], None if residual is None else residual[s])
    trace._stacked = torch.from_numpy(loads)
    trace.meta = meta(regime, shape, dims, seed, name, sim)
    return derive_no_cache(trace) if shape.mode == "block" and shape.cache == "none" else trace


def sharpened(expected: np.ndarray, power: float) -> np.ndarray:
    """Each row of expected loads [..., E] raised to `power` and scaled back to its total
    (params.py `hint_sharpness`; 0: uniform)."""
    w = np.power(np.clip(expected.astype(np.float64), 1e-30, None), power)
    w *= expected.sum(-1, keepdims=True) / w.sum(-1, keepdims=True)
    return w.astype(np.float32)


def predicted_loads(loads: np.ndarray, expected: np.ndarray, quality: float) -> np.ndarray:
    """A hint channel [S, L, E]: row l = quality x layer l+1's true load + (1 - quality) x its
    expectation under the request's popularity (the last layer predicts nothing)."""
    hints = np.zeros(loads.shape, dtype=np.float32)
    hints[:, :-1] = quality * loads[:, 1:] + (1 - quality) * expected[:, 1:]
    return hints


def meta(regime: RoutingRegime, shape: TraceShape, dims: Dims, seed: int, name: str, sim: Simulated
         ) -> dict[str, Any]:
    kinds = [info.kind for info, _, _ in sim.steps]
    generated = list(shape.gen_tokens)
    out: dict[str, Any] = {
        "purpose": "workload", "routing": "generated", "model": dims.model, "weights": "generated",
        "checkpoint": f"generated:{name or 'regime'}", "regime_name": name or None, "regime": regime.as_dict(),
        "seed": seed, "prompts": shape.requests, "generated_tokens": sum(generated),
        "requested_tokens": sum(generated), PER_PROMPT_TOKENS: generated,
        "denoise_steps": kinds.count("denoise"), "absent": ["token_texts"], "hints": "generated",
    }
    if shape.mode == "ar":
        out["decode_steps"] = kinds.count("decode")
        out["decode"] = {"block_length": shape.block, "steps": shape.block}
    else:
        out["decode"] = {"gen_length": max(generated), "block_length": shape.block,
                         "steps": max(max(s) for s in shape.steps), "cache": shape.cache}
    return out
