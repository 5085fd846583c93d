"""The knobs of generated routing and the shape of the trace it fills (docs/routing-regimes.md).

`RoutingRegime` is what decides placement policies, each knob named and documented below;
`TraceShape` is which forwards the decode loop runs (autoregressive prefill + decode, or
block diffusion's denoising steps, commits and prefill), so a generated trace has the
structure a recorded one has. A regime file (YAML or JSON) holds both:

    regime: {skew: 1.1, shared: 0.4, locality: 0.3, ...}
    shape: {mode: ar, requests: 8, prompt_tokens: [...], gen_tokens: [...], ...}   # optional
    fitted_from: {...}   # what `fit` read, and the statistics it matched

Bad values are one-line errors naming the knob and its range.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from harness.common.errors import HarnessError
from harness.common.files import write_atomic

MODES = ("ar", "block", "canvas")  # autoregressive | LLaDA2's block diffusion | DiffusionGemma's canvases
CACHES = ("prefix", "none")
MAX_LAG = 4  # the furthest earlier token/step a reuse may come from
RANGES = {"skew": (0.0, 4.0), "shared": (0.0, 1.0), "locality": (0.0, 0.99), "decay": (0.0, 0.95),
          "affinity": (0.0, 0.99), "cohesion": (0.0, 0.99), "unmasking": (0.0, 1.0),
          "prefill_skew": (0.0, 4.0), "hint_quality": (0.0, 1.0),
          "gate_concentration": (1e-3, 1e3), "period": (1.0, 2.0), "calibration_shared": (0.0, 1.0),
          "residual_hint_quality": (0.0, 1.0), "lognormal": (0.0, 1.0),
          "prefill_overlap": (0.0, 1.0), "unmask_redraw": (0.0, 1.0),
          "hint_sharpness": (0.0, 8.0), "solo_locality": (0.0, 0.99), "mask_overlap": (0.0, 1.0),
          "masked_locality": (0.0, 0.99)}
WHOLE = ("period", "lognormal")  # knobs that take whole numbers only
# knobs that may be unset (None): left out of as_dict
OPTIONAL = ("calibration_shared", "residual_hint_quality", "lognormal", "prefill_overlap", "unmask_redraw",
            "hint_sharpness", "solo_locality", "mask_overlap", "masked_locality")
PER_TOKEN = ("mask_overlap", "masked_locality")  # knobs of a token's masked state: they need `unmask_redraw`


@dataclass(frozen=True)
class RoutingRegime:
    """The routing knobs (every one a property some placement policy exploits).

    skew          Zipf exponent s of each layer's expert popularity in decoding forwards:
                  the i-th most popular expert gets weight (i+1)^-s (0: uniform). Both the
                  shared and the per-request popularity have this skew. With `lognormal`
                  set, the log-normal spread sigma instead (see there).
    shared        share of the popularity common to every request (0..1): a request's
                  popularity at a layer is shared x the layer's global Zipf ranking +
                  (1 - shared) x a Zipf ranking of its own (cross-request correlation:
                  what a calibration-based static placement can learn).
    locality      probability that one of a token's top-k slots reuses an expert the same
                  token used one denoising step earlier (block diffusion) or the previous
                  token used (autoregressive), at the same layer (temporal locality:
                  what caches and TIDE's refresh exploit).
    solo_locality the same probability for a diffusion slot whose expert had that token alone
                  at the step it would reuse from (0..0.99): a block's light experts come and
                  go whole while its shared ones stay, which sets how fast a step's top-B set
                  turns over (TIDE's drift; docs/routing-regimes.md). Unset: `locality` for
                  every slot, the trace bit for bit as before the knob existed.
    decay         how that dependence fades with distance: a reuse comes from lag d
                  (1..MAX_LAG) with probability proportional to decay^(d-1) (0: only the
                  previous token/step).
    period        the distance, in tokens/steps, of the nearest reuse: 1 (the previous one)
                  or 2 (the one before it: a decode that alternates between two states, as
                  the greedy decodes of random proxies loop over two tokens, reuses every
                  second token's experts and not its neighbour's); lag d of `decay` is then
                  d x period tokens back. Not searched by `fit`: read off the trace's overlap
                  at lags 1..4 (harness/routing/moments.py).
    cohesion      probability that one of a token's slots takes an expert of its forward's
                  anchor set (k experts drawn once per forward and layer): the tokens of one
                  forward route alike (a diffusion window's masked tokens look the same;
                  decides a denoising step's distinct experts, what TIDE's per-step split sees)
    unmasking     how much of cohesion a block's (canvas's) denoising steps lose as its tokens
                  are unmasked (0..1): at step s of a block the cohesion probability is
                  cohesion x (1 - unmasking x (1 - 2^-s)) (each step unmasks half the tokens
                  still masked, generate.UNMASKED_PER_STEP; the block's commit at s = its steps;
                  a diffusion prefill's prompt, never masked, at s = the block length). The
                  first step's tokens, all masked, route alike; later ones diverge, down to
                  cohesion x (1 - unmasking). 0: flat cohesion, the trace bit for bit as before
                  the knob existed. Autoregressive forwards keep `cohesion` as it is. With
                  `unmask_redraw` set, per token instead: a masked token at `cohesion`, an
                  unmasked one at cohesion x (1 - unmasking).
    unmask_redraw  per-token unmasking (block diffusion and canvases; 0..1): each token of a
                  block is unmasked at the end of a step drawn uniformly over the block's steps
                  (a seeded stream of its own), so the forwards before see it masked and the ones
                  after unmasked; at the first forward that sees it unmasked the token, with
                  probability unmask_redraw, routes afresh (its content is new: no reuse) and
                  reuses from then on only what it routed since. A token's memory then ends
                  at an event spread over the block, and the overlap of a block's steps falls
                  about linearly with their distance, as LLaDA2's does (docs/routing-regimes.md),
                  instead of geometrically. Unset: cohesion by the step schedule above and no
                  redraws, the trace bit for bit as before the knob existed.
    mask_overlap  how much a block's masked tokens route like its unmasked ones (0..1; needs
                  `unmask_redraw`): a masked token's popularity, and the forward's anchor set
                  (`cohesion`), is mask_overlap x the decoding rankings' + (1 - mask_overlap) x
                  rankings of the masked state's own (shared and per request, mixed by `shared`,
                  at `skew`; a seeded stream of their own). A window of mask tokens is one input
                  the model sees again at every block, not the content it unmasks into, so the
                  experts of a block's first step are not the ones of its last (LLaDA2: the top-8
                  of a block's first and last steps share 0.07 of their union, what two requests
                  share) and the set TIDE refreshes at a block's start covers less and less of
                  it (docs/routing-regimes.md). Unset: 1, the decoding rankings, as before.
                  `fit` searches it only when asked (also=; mini's anchor is fitted with it).
    masked_locality  `locality` of a slot of a token still masked (0..0.99; needs
                  `unmask_redraw`): how much a masked token's experts turn over from one step to
                  the next while the tokens around it are unmasked (LLaDA2: as much as an
                  unmasked token's). Unset: `locality` (and `solo_locality`), as before. `fit`
                  searches it only when asked, as `mask_overlap`.
    affinity      probability that one of a token's free slots at layer l+1 takes the
                  expert a fixed per-layer map assigns to one of its layer-l experts
                  (cross-layer predictability: what DALI's prefetch and ExFlow-style
                  placement exploit).
    prefill_skew  Zipf exponent of the prefill (prompt) forwards' popularity, over the
                  same rankings as decoding (prefill vs decode difference).
    prefill_overlap  how much a request's prefill routes like its decoding (0..1): the prefill
                  popularity is prefill_overlap x the decoding rankings' + (1 - prefill_overlap)
                  x rankings of the prefill's own (shared and per request, mixed by `shared`),
                  both at prefill_skew (a prompt's tokens are not the generated ones: what a
                  cache warmed by the prefill keeps for the decode). Unset: 1, the decoding
                  rankings, as before the knob existed.
    hint_quality  the next-layer hint each forward carries: hint_quality x the true next
                  layer load + (1 - hint_quality) x its expectation under the request's
                  popularity (1: a perfect predictor; what DALI's prefetch reads).
    hint_sharpness  how sharp the uninformed part of both hint channels is (0..8): the
                  request's popularity raised to this power, renormalized (0: uniform over the
                  experts, a gate that prefers none; above 1: sharper than the popularity). A
                  prefetcher that assigns by predicted loads (DALI) acts on the hint's shape, not
                  only on how well it correlates with the truth: a flat hint names every expert
                  a little, a sharp one a few a lot. Unset: 1, the popularity as it is, as
                  before the knob existed; `fit` matches the entropy of a trace's hints
                  (harness/routing/fit.py).
    gate_concentration  Dirichlet concentration of the top-k gate weights of `route_ids`
                  (recorded with ids, never replayed: the cost model charges token counts).
    calibration_shared  `shared` of the calibration requests (the ones held out for the
                  systems that learn, harness/routing/replayable.py): how much of the
                  workload's common popularity a calibration set shares (a model's calibration
                  prompts are not the workload's problems). Unset (None): `shared`, as before
                  the knob existed; `fit` reads it off the calibration recorded beside a trace.
    lognormal     the popularity's shape: unset or 0, Zipf ranks (above); 1, log-normal: the
                  i-th most popular expert of E gets weight exp(skew x z_i), z_i the standard
                  normal quantile at (E - i - 1/2) / E. At equal entropy a log-normal has a
                  flatter head, more mass in the middle and a lighter tail than a Zipf
                  ranking, as the recorded proxies' popularity has (docs/routing-regimes.md).
                  `fit` fits both shapes and keeps the better.
    residual_hint_quality  hint_quality of the second hint channel, the residual predictor's
                  (harness/model/hints.py; what DALI reads by default): the same mix of the true
                  next-layer load and its expectation, drawn apart from the next-gate one. Unset
                  (None): the trace carries one predictor that stands in for both channels, as
                  before the knob existed; `fit` reads it off a trace's residual hints.
    """

    skew: float = 1.0
    shared: float = 0.5
    locality: float = 0.3
    decay: float = 0.0
    affinity: float = 0.0
    cohesion: float = 0.0
    unmasking: float = 0.0
    prefill_skew: float = 1.0
    hint_quality: float = 0.5
    gate_concentration: float = 1.0
    period: float = 1.0
    calibration_shared: float | None = None
    residual_hint_quality: float | None = None
    lognormal: float | None = None
    prefill_overlap: float | None = None
    unmask_redraw: float | None = None
    hint_sharpness: float | None = None
    solo_locality: float | None = None
    mask_overlap: float | None = None
    masked_locality: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in OPTIONAL:
                continue
            low, high = RANGES[f.name]
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) \
                    or not low <= value <= high:
                raise HarnessError(f"routing knob {f.name}={value!r} must be a number in [{low}, {high}] "
                                   "(docs/routing-regimes.md)")
            if f.name in WHOLE and value != int(value):
                raise HarnessError(f"routing knob {f.name}={value!r} must be a whole number in [{low:g}, {high:g}] "
                                   "(docs/routing-regimes.md)")
        for name in PER_TOKEN:
            if getattr(self, name) is not None and self.unmask_redraw is None:
                raise HarnessError(f"routing knob {name} acts on a token's masked state: set unmask_redraw too "
                                   "(per-token unmasking, docs/routing-regimes.md)")

    def as_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}

    def shared_of(self, request: int, workload: int) -> float:
        """`shared` of request `request` (the calibration requests come after the `workload` ones)."""
        return self.shared if request < workload or self.calibration_shared is None else self.calibration_shared

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "regime") -> RoutingRegime:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise HarnessError(f"{where}: unknown routing knob {unknown[0]!r}; the knobs are "
                               f"{', '.join(sorted(known))}")
        return cls(**{k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in data.items()})


@dataclass
class TraceShape:
    """Which forwards a generated trace holds, per request (lists of one entry per request).

    mode            ar: one prefill over the prompt, then one decode forward per further
                    generated token (P = 0: no prefill, one decode forward per generated token,
                    as an import without a prompt split); block: LLaDA2's loop (the prompt's whole blocks in one
                    prefill, then per block its denoising steps over the block's tokens and a
                    commit of the finished block, the last block uncommitted); canvas:
                    DiffusionGemma's (the prompt in one prefill, then per canvas its
                    denoising steps and the commit of the finished canvas)
    prompt_tokens   P per request
    gen_tokens      generated tokens per request
    block           ar: decode steps per window (TIDE's block); block/canvas: its length
    steps           block/canvas: per request, the denoising steps each block took
    cache           block: prefix (as recorded) or none (every step routes the window)
    """

    mode: str = "ar"
    prompt_tokens: list[int] = field(default_factory=lambda: [64] * 8)
    gen_tokens: list[int] = field(default_factory=lambda: [64] * 8)
    block: int = 32
    steps: list[list[int]] = field(default_factory=list)
    cache: str = "prefix"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise HarnessError(f"shape.mode={self.mode!r} is not allowed; use one of {', '.join(MODES)}")
        if self.cache not in CACHES:
            raise HarnessError(f"shape.cache={self.cache!r} is not allowed; use prefix or none")
        if not self.prompt_tokens or len(self.prompt_tokens) != len(self.gen_tokens):
            raise HarnessError("shape: prompt_tokens and gen_tokens must list one count per request (at least one)")
        if any(not isinstance(v, int) or v < 0 for v in [*self.prompt_tokens, *self.gen_tokens]) \
                or not isinstance(self.block, int) or self.block < 1:
            raise HarnessError("shape: token counts must be whole numbers >= 0 and block a whole number >= 1")
        if self.mode == "ar" and any(g < 1 for g in self.gen_tokens):
            raise HarnessError("shape: an autoregressive request needs a generated token")
        if self.mode != "ar":
            if not self.steps:
                self.steps = [[self.block] * self.blocks_for_tokens(r) for r in range(self.requests)]
            if len(self.steps) != self.requests or any(not s or min(s) < 1 for s in self.steps):
                raise HarnessError("shape.steps must list, per request, the denoising steps (>= 1) of each of "
                                   "its generated blocks (at least one)")

    @property
    def requests(self) -> int:
        return len(self.prompt_tokens)

    def first_block(self, r: int) -> int:
        return self.prompt_tokens[r] // self.block if self.mode == "block" else 0

    def n_blocks(self, r: int) -> int:
        """Blocks (canvases) request r denoises: as many as its `steps` list."""
        return len(self.steps[r])

    def blocks_for_tokens(self, r: int) -> int:
        """The blocks (canvases) the decode loop runs for request r's prompt and generation."""
        if self.mode == "block":
            total = -(-(self.prompt_tokens[r] + self.gen_tokens[r]) // self.block)
            return total - self.first_block(r)
        return -(-self.gen_tokens[r] // self.block)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TraceShape:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise HarnessError(f"shape: unknown field {unknown[0]!r}; the fields are {', '.join(sorted(known))}")
        return cls(**data)


@dataclass
class RegimeFile:
    """A regime file: the knobs, optionally the shape, and where a fit came from."""

    regime: RoutingRegime
    shape: TraceShape | None = None
    fitted_from: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def save(self, path: str | Path) -> Path:
        data: dict[str, Any] = {"name": self.name, "regime": self.regime.as_dict()}
        if self.shape is not None:
            data["shape"] = self.shape.as_dict()
        if self.fitted_from:
            data["fitted_from"] = self.fitted_from
        path = Path(path)
        # a YAML regime says what it is in its first line: `python -m harness --help` shows it as
        # the routing option's description when the file sits in conf/routing/
        f = self.fitted_from
        what = (f"# Generated routing fitted to the {f.get('routing', '?')} routing of {f.get('model', '?')} "
                f"({f.get('weights', '?')} weights; python -m harness.routing fit, docs/routing-regimes.md)\n"
                if f else "# Generated routing: a named regime (docs/routing-regimes.md)\n")
        text = json.dumps(data, indent=1) if path.suffix == ".json" else what + yaml.safe_dump(data, sort_keys=False)
        return write_atomic(path, lambda f: f.write(text.encode()))

    @classmethod
    def load(cls, path: str | Path) -> RegimeFile:
        path = Path(path)
        if not path.is_file():
            raise HarnessError(f"regime={path} is not a file; write one with python -m harness.routing fit")
        try:
            data = yaml.safe_load(path.read_text())  # JSON is YAML
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise HarnessError(f"regime file {path} is not YAML or JSON ({type(exc).__name__}); "
                               "write one with python -m harness.routing fit") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, where: str) -> RegimeFile:
        if not isinstance(data, dict) or not isinstance(data.get("regime"), dict):
            raise HarnessError(f"regime file {where} holds no 'regime' mapping of knobs; "
                               "write one with python -m harness.routing fit")
        try:
            shape = TraceShape.from_dict(data["shape"]) if isinstance(data.get("shape"), dict) else None
        except TypeError as exc:
            raise HarnessError(f"regime file {where}: bad shape ({exc})") from None
        return cls(RoutingRegime.from_dict(data["regime"], where), shape, dict(data.get("fitted_from") or {}),
                   str(data.get("name") or Path(where).stem))


@dataclass
class RoutingConfig:
    """The `routing` option of a run (conf/routing/*.yaml): `recorded` (the model's own routing,
    recorded or imported) or a named regime, whose generated trace a replay runs over instead
    (harness/job/replay.py): `regime` its knobs, `shape` its forwards (optional: else the run's
    prompts, decode.gen_length and block), `calibration` requests generated and held out for
    the systems that learn, `seed` the generator's."""

    name: str = "recorded"
    regime: dict[str, Any] = field(default_factory=dict)
    shape: dict[str, Any] | None = None
    seed: int = 0
    calibration: int = 2
    fitted_from: dict[str, Any] = field(default_factory=dict)

    @property
    def generated(self) -> bool:
        return self.name != "recorded"

    def regime_file(self) -> RegimeFile:
        data = {"name": self.name, "regime": dict(self.regime), "shape": dict(self.shape) if self.shape else None,
                "fitted_from": dict(self.fitted_from)}
        return RegimeFile.from_dict(data, f"routing={self.name}")
