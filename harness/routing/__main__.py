"""`python -m harness.routing <verb> key=value ...`: generated routing (docs/routing-regimes.md).

  fit       trace=<trace.npz> out=<regime.yaml> [name=] [seed=0] [recorded_by=<command>]
            [also=mask_overlap,masked_locality] [average=1] [popularity=zipf,lognormal]: the
            knobs whose generated traces match the trace's statistics, with its shape, into a
            regime file (with a calibration.npz beside the trace, also calibration_shared;
            `also`: opt-in knobs searched too; `average`: statistics averaged over that many
            generated traces; `popularity`: the shapes tried)
  generate  regime=<regime.yaml | conf/routing name> model=<name> [config=<config.json>]
            out=<trace.npz> [seed=0] [calibration=2] [requests=] [prompt=] [gen=]: a trace for
            any model's geometry; `calibration` more requests go to calibration.npz beside it
            (the systems that learn from a calibration read it, as a live recording's)

Bad input is one line on stderr and exit code 2; files are written whole or not at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.common.errors import HarnessError, exit_with
from harness.common.keyvalue import KeyValueCommand, Option, wants_help
from harness.placement.trace import RoutingTrace
from harness.routing.fit import fit_file
from harness.routing.named import regime_file
from harness.routing.replayable import generate_with_calibration
from harness.zoo.entry import model_names

FIT = KeyValueCommand(
    "python -m harness.routing fit", "fit the routing knobs to a trace and write a regime file",
    [Option("trace", "a trace.npz (a recording, an import, a generated one)", required=True),
     Option("out", "the regime file to write (.yaml or .json)", required=True),
     Option("name", "the regime's name (default: the out file's stem)"),
     Option("seed", "the seed of the fit's simulations", "0"),
     Option("recorded_by", "the command that recorded the trace (kept in the regime file: say it when the "
            "trace is a temporary file)"),
     Option("also", "knobs to search besides fit's own, comma-separated: mask_overlap, masked_locality "
            "(off by default; mini's anchor fits mask_overlap)"),
     Option("average", "generated traces (seeds seed, seed + 1, ...) whose statistics the fit averages: a "
            "short trace's chance fluctuations otherwise fit too (costs as many times the time)", "1"),
     Option("popularity", "the popularity shapes tried, comma-separated: zipf, lognormal (the one whose head "
            "share comes closer is kept)", "zipf,lognormal")],
    example="python -m harness.routing fit trace=outputs/runs/<run>/trace.npz out=conf/routing/mine.yaml")
GENERATE = KeyValueCommand(
    "python -m harness.routing generate", "generate a routing trace from a regime file for any model",
    [Option("regime", "a regime file, or a name of conf/routing/", required=True),
     Option("model", "any model= option (hf with config=)", required=True),
     Option("config", "model=hf: the model's config.json or its directory"),
     Option("out", "the trace to write (.npz); calibration.npz goes beside it", required=True),
     Option("seed", "the generator's seed", "0"),
     Option("calibration", "requests generated for calibration.npz (0: none)", "2"),
     Option("requests", "requests to generate (default: the regime's shape)"),
     Option("prompt", "prompt tokens per request (default: the regime's shape)"),
     Option("gen", "generated tokens per request (default: the regime's shape)")],
    example="python -m harness.routing generate regime=conf/routing/mixtral_fit.yaml model=qwen3_235b_a22b "
            "out=traces/gen.npz")
VERBS = {"fit": FIT, "generate": GENERATE}


def _int(args: dict[str, str], key: str, low: int = 0) -> int | None:
    if args.get(key) in (None, ""):
        return None
    try:
        value = int(args[key])
    except ValueError:
        value = low - 1
    if value < low:
        raise HarnessError(f"{key}={args[key]!r} must be a whole number >= {low}")
    return value


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VERBS:
        if wants_help(argv):
            print(__doc__)
            return 0
        raise HarnessError(f"python -m harness.routing: give a verb first: {', '.join(VERBS)} (each answers --help)")
    verb, args = argv[0], VERBS[argv[0]].parse(argv[1:])
    seed = _int(args, "seed") or 0
    if verb == "fit":
        average = _int(args, "average", 1) or 1
        trace = RoutingTrace.load(args["trace"])
        out = Path(args["out"])
        beside = Path(args["trace"]).parent / "calibration.npz"
        calibration = RoutingTrace.load(beside) if beside.is_file() else None
        also = tuple(k for k in (args.get("also") or "").split(",") if k)
        shapes = tuple(k for k in args["popularity"].split(",") if k)
        regime = fit_file(trace, args.get("name") or out.stem, args["trace"], seed, calibration, also,
                          average, shapes)
        if args.get("recorded_by"):
            regime.fitted_from = {"trace": regime.fitted_from["trace"], "recorded_by": args["recorded_by"],
                                  **{k: v for k, v in regime.fitted_from.items() if k != "trace"}}
        regime.save(out)
        print(f"fitted {regime.regime.as_dict()} -> {out}")
        for knob, pair in regime.fitted_from["statistics"].items():
            print(f"  {knob:13s} target {pair['target']}  reached {pair['reached']}")
        return 0
    if args["model"] not in model_names():
        raise HarnessError(f"model={args['model']!r} is not allowed; use one of {', '.join(model_names())}")
    regime = regime_file(args["regime"])
    trace, calibration = generate_with_calibration(
        regime, args["model"], args.get("config"), seed, _int(args, "calibration") or 0,
        _int(args, "requests", 1), _int(args, "prompt"), _int(args, "gen", 1))
    out = trace.save(args["out"])
    if calibration is not None:
        calibration.save(out.parent / "calibration.npz")
    print(f"generated {len(trace)} forwards of {trace.meta['prompts']} requests ({trace.n_layers} MoE layers x "
          f"{trace.n_experts} experts) from regime {regime.name} -> {out}"
          + (f" (+ calibration.npz, {calibration.meta['prompts']} requests)" if calibration is not None else ""))
    return 0


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
