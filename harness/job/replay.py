"""Replay: any system and the cost model over a recorded routing trace, with no model.

    python -m harness source=trace system=tide                    # the cached workload trace
    python -m harness source=trace trace.path=outputs/runs/X/trace.npz system=fiddler

With `trace.path: null` the trace is the cached gpu_only routing of this model, workload
and decode settings (recorded live on first use, then shared by every job of a sweep).
An explicit path is a `trace.npz` written by a live run with `trace.record=true` (its
calibration trace is the `calibration.npz` beside it) or by `python -m harness.traces import`
(routing recorded elsewhere, docs/real-routing.md); with `calibration.from_workload=N` the
trace's last N requests are the calibration, held out of the replay. An imported trace's
routing statistics go into the result (`routing`), as a live recording's do.

The engine sees exactly what it saw live (the same loads, tokens, context and hints per
forward), so a replay gives the same counters and modeled time as the live run; a test
holds the two together. Replays have no numerics: there is no lossless check and no wall
clock throughput.

Serving (docs/traces-and-experiments.md, "Serving"): `workload.batch=N` serves the
requests N at a time in lock-step batches, all at time 0 (harness/traces/serving.py);
`workload.arrivals=poisson|trace` serves them as they arrive, with up to `workload.batch`
running and the batch rebuilt every forward (harness/traces/arrivals.py). Arrivals replay
every system through the engine, forward by forward (the next forward's members depend on
how long this one took), to the same bits a batch replay charges; what systems learn from
(the calibration) is batched in lock-step either way.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from harness.common.errors import HarnessError
from harness.decode.loading import LoadedModel
from harness.decode.workload import load_prompts, workload_record
from harness.job.artifacts import calibration_path, calibration_trace, workload_trace
from harness.job.config import HarnessConfig
from harness.job.setup import build_result, setup_run
from harness.placement.system import MoEGeometry, System
from harness.placement.trace import RoutingTrace
from harness.results.run_result import RunIdentity, RunResult
from harness.routing.named import ANCHOR, anchor_of
from harness.routing.replayable import generate_with_calibration
from harness.traces.arrival_times import arrival_times
from harness.traces.arrivals import Served, arrival_figures, continuous, engine_forward
from harness.traces.batch_replay import replay_trace
from harness.traces.holdout import hold_out
from harness.traces.routing_stats import statistics_with_uniform
from harness.traces.serving import (
    PER_PROMPT_TOKENS,
    ServedBatches,
    lacks_request_tokens,
    lockstep,
    prompt_rows,
    serving_figures,
)
from harness.zoo.entry import load_model, nominal_geometry


def check_geometry(trace: RoutingTrace, geometry: MoEGeometry, path: Path, model: str = "?") -> None:
    """The trace was recorded with this model's geometry (MoE layers x experts, and the
    geometry it stored when it has one): a trace of another model is refused by name."""
    recorded = trace.meta.get("model", "?") if isinstance(trace.meta.get("model"), str) else "?"
    same_shape = (trace.n_layers, trace.n_experts) == (geometry.n_moe_layers, geometry.num_experts)
    stored = trace.geometry
    same_geometry = all(stored.get(k, getattr(geometry, k)) == getattr(geometry, k) for k in GEOMETRY_KEYS)
    if not (same_shape and same_geometry):
        raise HarnessError(
            f"trace {path} was recorded with model={recorded} ({trace.n_layers} MoE layers x {trace.n_experts} "
            f"experts) but model={model} ({geometry.n_moe_layers} x {geometry.num_experts}) is configured; "
            "replay it with the model it was recorded with"
        )


GEOMETRY_KEYS = ("num_hidden_layers", "first_k_dense_replace", "num_experts", "num_experts_per_tok")


def meta_count(trace: RoutingTrace, key: str, path: Path) -> int:
    """An integer the trace's meta records (prompts, tokens, steps); 0 when absent."""
    value = trace.meta.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HarnessError(f"trace {path} records {key}={value!r} in its meta; record it again")
    return value


def recorded_steps(trace: RoutingTrace, path: Path, default: int) -> int:
    """Denoising steps per block the trace was decoded with (its meta's decode.steps)."""
    decode = trace.meta.get("decode", {})
    steps = decode.get("steps", default) if isinstance(decode, dict) else None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise HarnessError(f"trace {path} records decode.steps={steps!r} in its meta; record it again")
    gen = decode.get("gen_length")  # the decode clamps its steps per block to gen_length, as the reference
    return min(steps, gen) if isinstance(gen, int) and not isinstance(gen, bool) and gen >= 1 else steps


def require_request_tokens(trace: RoutingTrace, path: Path, arrivals: bool = False) -> None:
    """Serving a block-diffusion trace needs each request's generated tokens (its time per
    output token), which traces recorded before the serving rule of docs/dali-and-gem.md do not hold."""
    if lacks_request_tokens(trace):
        asked, fix = ("workload.arrivals", "workload.arrivals=static") if arrivals else \
            ("workload.batch > 1", "workload.batch=1")
        raise HarnessError(f"trace {path} records no per-request generated tokens (meta {PER_PROMPT_TOKENS}), "
                           f"which {asked} needs for a block-diffusion trace's time per output token: "
                           f"record it again (a live run with trace.record=true) or use {fix}")


def explicit_traces(path: Path, needs_calibration: bool, held_out: int = 0
                    ) -> tuple[RoutingTrace, RoutingTrace | None, str | None]:
    """The trace at `path` and the calibration its systems learn from, with where it came
    from: with calibration.from_workload = N its last N requests, held out of the replay
    (harness/traces/holdout.py); else the calibration.npz a live run recorded beside it."""
    trace = RoutingTrace.load(path)
    if held_out > 0:  # every system replays the same requests, whether it learns or not
        trace, held = hold_out(trace, held_out, path)
        return trace, (held if needs_calibration else None), (f"{path} (its last {held_out} requests, held out)"
                                                              if needs_calibration else None)
    if not needs_calibration:
        return trace, None, None
    beside = path.parent / "calibration.npz"
    if not beside.exists():
        if trace.meta.get("routing") == "imported":
            raise HarnessError(f"this system learns from a calibration trace but {path} is an import with no "
                               f"{beside.name} beside it: set calibration.from_workload=N to learn from its last N "
                               "requests, held out of the replay")
        raise HarnessError(f"this system learns from a calibration trace but there is no {beside}; "
                           "record the trace with a live run and trace.record=true")
    return trace, RoutingTrace.load(beside), str(beside)


def hint_stand_in(trace: RoutingTrace, wants_hint: bool) -> str | None:
    """What a hint-using system's next-layer prediction is over this trace: recorded (the
    model's own router on the hidden state), next_layer_loads (an import's perfect
    predictor) or none (no hints: its prefetch predicts nothing); None if it wants none."""
    if not wants_hint:
        return None
    if trace.meta.get("hints") == "next_layer_loads":
        return "next_layer_loads"
    return "recorded" if trace.has_hints else "none"


def check_hint_channel(trace: RoutingTrace, system: System, path: Path) -> None:
    """A system that reads a hint channel the trace's recorded hints lack is refused (one
    line): the trace was recorded before that channel existed. A trace without any hints
    (an import with hints=none) replays as before: the prediction is empty whatever the channel."""
    channel = system.hint_channel
    if system.wants_hint and trace.has_hints and not trace.has_channel(channel):
        raise HarnessError(f"trace {path} carries no {channel} hints (recorded before that channel existed), which "
                           f"system={system.name} reads; record the trace again, or set system.predictor=next_gate")


def generated_traces(cfg: HarnessConfig, needs_calibration: bool
                     ) -> tuple[RoutingTrace, RoutingTrace | None, Path]:
    """routing=<regime>: the trace generated for this model at the run's sizes (its prompts,
    decode.gen_length, block, cache), and its held-out calibration requests (generated for
    every system, so that every system replays the same requests)."""
    r, d = cfg.routing, cfg.decode
    regime = anchor_of(str(cfg.model.name)) if r.name == ANCHOR else r.regime_file()
    trace, calibration = generate_with_calibration(
        regime, str(cfg.model.name), cfg.model.path if cfg.model.name == "hf" else None, r.seed, r.calibration,
        cfg.limit_prompts, None, d.gen_length, d.block_length, d.cache)
    return trace, calibration if needs_calibration else None, Path(f"generated:{regime.name}")


def run_replay(cfg: HarnessConfig, run_dir: str | Path) -> RunResult:
    run_dir = Path(run_dir)
    settings = cfg.decode
    setup = setup_run(cfg, nominal_geometry(cfg.model))
    loaded: list[LoadedModel] = []

    def model() -> LoadedModel:  # only when a cached trace has to be recorded first
        if not loaded:
            loaded.append(load_model(cfg.model, cfg.cache_dir))
        return loaded[0]

    workload = None  # an explicit trace holds prompts this config does not name
    if cfg.routing.generated:  # a named regime's routing, generated for this model (docs/routing-regimes.md)
        trace, calibration, path = generated_traces(cfg, setup.needs_calibration)
        calibration_file = f"{path} (its last {cfg.routing.calibration} requests, held out)" \
            if calibration is not None else None
    elif cfg.trace.path is not None:
        path = Path(cfg.trace.path)
        trace, calibration, calibration_file = explicit_traces(path, setup.needs_calibration,
                                                               cfg.calibration.from_workload)
    else:
        prompts = load_prompts(cfg.workload, cfg.limit_prompts)
        workload = workload_record(cfg.workload, prompts)
        # serving needs each request's tokens: a cached trace recorded before they were kept is recorded again
        stale = lacks_request_tokens if cfg.workload.batch > 1 or cfg.workload.arrivals != "static" else None
        trace, path = workload_trace(cfg, prompts, settings, model, stale)
        calibration = calibration_trace(cfg, settings, model) if setup.needs_calibration else None
        calibration_file = str(calibration_path(cfg, settings)) if calibration is not None else None
    check_geometry(trace, setup.geometry, path, str(cfg.model.name))
    # the cached one is keyed by this model; held-out requests are the trace's own
    if calibration is not None and cfg.trace.path is not None and cfg.calibration.from_workload == 0:
        check_geometry(calibration, setup.geometry, path.parent / "calibration.npz", str(cfg.model.name))
    # an imported trace's routing statistics (harness/traces/routing_stats.py), before batching
    routing = statistics_with_uniform(trace, max(1, setup.budget.experts_per_layer)) \
        if trace.meta.get("routing") in ("imported", "generated") else None
    if routing is not None and trace.meta.get("routing") == "generated":  # which regime: name, knobs, seed
        routing["regime"] = {"name": trace.meta.get("regime_name"), **trace.meta["regime"],
                             "seed": trace.meta.get("seed")}

    arrivals = arrival_times(cfg.workload, len(prompt_rows(trace)))  # None: static batches
    served: ServedBatches | Served | None = None
    if arrivals is not None:  # requests join as they arrive (harness/traces/arrivals.py)
        require_request_tokens(trace, path, arrivals=True)
    elif cfg.workload.batch > 1:  # lock-step serving: the batch's loads summed (harness/traces/serving.py)
        require_request_tokens(trace, path)
        served = lockstep(trace, cfg.workload.batch)
        trace = served.trace
    if calibration is not None and cfg.workload.batch > 1:  # what a system learns from: batched in lock-step
        calibration = lockstep(calibration, cfg.workload.batch).trace
    check_hint_channel(trace, setup.system, path)
    engine = setup.engine()
    engine.prepare(calibration, recorded_steps(trace, path, settings.steps))
    start = time.perf_counter()
    if arrivals is not None:  # the schedule depends on each forward's time: built forward by forward
        served = continuous(trace, cfg.workload.batch, arrivals, engine_forward(engine))
        trace, replay_mode = served.trace, "engine"
    else:
        replay_mode = replay_trace(engine, trace).mode  # in batch where the system plans in batch
    replay_s = time.perf_counter() - start
    counts = {
        "prompts": meta_count(trace, "prompts", path),
        "generated_tokens": meta_count(trace, "generated_tokens", path),
        "denoise_steps": meta_count(trace, "denoise_steps", path),
        "routed_tokens": sum(trace.n_tokens),
    }
    if "requested_tokens" in trace.meta:  # traces recorded before 2026-12-02 lack it
        counts["requested_tokens"] = meta_count(trace, "requested_tokens", path)
    if trace.meta.get("decode_steps"):  # an autoregressive family's recording
        counts["decode_steps"] = meta_count(trace, "decode_steps", path)
    if served is not None and "decode_steps" in counts:  # a batch's decode forward: a token of each request
        counts["decode_steps"] = Counter(s.kind for s in trace.steps)["decode"]
    clock = {"replay_s": replay_s,
             "layer_steps_per_s": len(trace) * trace.n_layers / replay_s if replay_s > 0 else 0.0}
    derived = trace.meta.get("derived_from")  # a no-cache trace derived from a prefix-cached recording
    identity = RunIdentity(source="trace", weights=trace.meta.get("weights", "?"),
                           checkpoint=trace.meta.get("checkpoint", "?"), trace=str(path), replay=replay_mode,
                           trace_derived_from=str(derived) if derived else None,
                           calibration=calibration_file,
                           routing_source=str(trace.meta["routing"]) if isinstance(trace.meta.get("routing"), str)
                           else None,
                           hints=hint_stand_in(trace, setup.system.wants_hint))
    result = build_result(cfg, setup, engine, counts, clock, identity, trace)
    result.routing = routing
    if served is not None:
        result.metrics.update(arrival_figures(served) if isinstance(served, Served) else
                              serving_figures([p["modeled_latency_s"] for p in result.step_series], served.requests))
        result.flat_metrics()  # a key reported twice is an error now, before anything is written
    result.workload = workload
    return result  # run_job writes result.json
