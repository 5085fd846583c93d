"""`python -m harness.traces <verb> key=value ...`: routing recorded elsewhere, in and out of
the harness's trace format (docs/real-routing.md).

  import  format=vllm|ids|jsonl in=<file or directory> model=<name> [config=<config.json>]
          out=<trace.npz>: check and convert, then print the trace's routing statistics
  export  in=<trace.npz> out=<responses.jsonl> [layout=split|combined]: a harness-recorded
          autoregressive trace as vLLM's saved responses (the importer's round trip)
  stats   trace=<trace.npz> [B=<experts>]: the routing statistics of any trace, beside
          their values under uniform routing

Bad input is one line on stderr and exit code 2; the trace is written whole or not at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.common.errors import HarnessError, exit_with
from harness.common.keyvalue import KeyValueCommand, Option, wants_help
from harness.placement.trace import RoutingTrace
from harness.traces.export import LAYOUTS, export_vllm
from harness.traces.ids_format import read_ids
from harness.traces.importing import DEFAULT_WINDOW, HINTS, Imported, build_trace, model_geometry
from harness.traces.jsonl_format import read_jsonl
from harness.traces.routing_stats import STAT_KEYS, statistics_with_uniform
from harness.traces.vllm_format import read_vllm
from harness.zoo.entry import model_names

FORMATS = ("vllm", "ids", "jsonl")
WEIGHTS = ("real", "trained-proxy", "random-proxy")  # what the recording ran on (result.json's `weights`)

IMPORT = KeyValueCommand(
    "python -m harness.traces import", "convert routing recorded elsewhere into a trace every system replays",
    [Option("format", f"{' | '.join(FORMATS)} (docs/real-routing.md)", required=True),
     Option("in", "the recorded file, or a directory of them", required=True),
     Option("model", "the model it was recorded on: hf (with config=) or any model= option", required=True),
     Option("config", "model=hf: the model's config.json or the directory holding it"),
     Option("out", "the trace to write (.npz)", required=True),
     Option("window", "decode steps per 'block' (TIDE's refresh window; decode.block_length)", str(DEFAULT_WINDOW)),
     Option("hints", "next-layer hints: none (absent) | next (the true next-layer load, a perfect predictor)", "none"),
     Option("weights", "what the recording ran on, for the results: real | trained-proxy | random-proxy", "real"),
     Option("fields", "jsonl: request:<name>,layer:<name>,token:<name>,experts:<name>[,weights:..][,phase:..]"),
     Option("layers", "jsonl: moe (MoE-layer indices) | decoder (decoder-layer indices)", "moe")],
    example="python -m harness.traces import format=vllm in=responses.jsonl model=hf config=config.json "
            "out=trace.npz")
EXPORT = KeyValueCommand(
    "python -m harness.traces export", "write a harness-recorded autoregressive trace as vLLM's saved responses",
    [Option("in", "a trace.npz recorded by a live run (trace.record=true)", required=True),
     Option("out", "the responses file to write (.jsonl, one response per line)", required=True),
     Option("layout", f"{' | '.join(LAYOUTS)} (docs/real-routing.md)", "split")],
    example="python -m harness.traces export in=outputs/runs/<run>/trace.npz out=responses.jsonl")
STATS = KeyValueCommand(
    "python -m harness.traces stats", "the routing statistics of a trace beside their uniform-routing values",
    [Option("trace", "a trace.npz", required=True),
     Option("B", "experts per layer the top-B statistics use (default: a quarter of the experts)")],
    example="python -m harness.traces stats trace=trace.npz")
VERBS = {"import": IMPORT, "export": EXPORT, "stats": STATS}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VERBS:
        if wants_help(argv):
            print(__doc__)
            return 0
        raise HarnessError(f"python -m harness.traces: give a verb first: {', '.join(VERBS)} (each answers --help)")
    verb, rest = argv[0], argv[1:]
    args = VERBS[verb].parse(rest)
    if verb == "import":
        return run_import(args)
    if verb == "export":
        out = export_vllm(RoutingTrace.load(args["in"]), args["out"], args["layout"])
        print(f"wrote {out}")
        return 0
    trace = RoutingTrace.load(args["trace"])
    print_statistics(trace, _int(args.get("B"), "B") if args.get("B") else None)
    return 0


def run_import(args: dict[str, str]) -> int:
    fmt, model = args["format"], args["model"]
    if fmt not in FORMATS:
        raise HarnessError(f"format={fmt!r} is not allowed; use one of {', '.join(FORMATS)}")
    if model not in model_names():
        raise HarnessError(f"model={model!r} is not allowed; use one of {', '.join(model_names())}")
    if args["weights"] not in WEIGHTS:
        raise HarnessError(f"weights={args['weights']!r} is not allowed; use one of {', '.join(WEIGHTS)}")
    if args["hints"] not in HINTS:
        raise HarnessError(f"hints={args['hints']!r} is not allowed; use {' or '.join(HINTS)}")
    geometry, model_cfg = model_geometry(model, args.get("config"))
    path = Path(args["in"])
    imported: Imported
    if fmt == "vllm":
        imported = read_vllm(path)
    elif fmt == "ids":
        imported = read_ids(path)
    else:
        imported = read_jsonl(path, geometry, args.get("fields"), args["layers"])
    trace = build_trace(imported, geometry, model_cfg, _int(args["window"], "window"), args["hints"],
                        args["weights"])
    out = trace.save(args["out"])
    m = trace.meta
    print(f"imported {m['prompts']} requests from {path} ({imported.source['format']}): {len(trace)} forwards, "
          f"{m['generated_tokens']} generated tokens, model={model} ({geometry.n_moe_layers} MoE layers x "
          f"{geometry.num_experts} experts, top-{geometry.num_experts_per_tok}); absent: {', '.join(m['absent'])} "
          f"-> {out}")
    print_statistics(trace, None)
    return 0


def print_statistics(trace: RoutingTrace, b: int | None) -> None:
    b = b if b is not None else max(1, trace.n_experts // 4)
    if not 1 <= b <= trace.n_experts:
        raise HarnessError(f"B={b} must be between 1 and the trace's {trace.n_experts} experts per layer")
    stats = statistics_with_uniform(trace, b)
    uniform = stats["uniform"]
    print(f"routing statistics at B={b} (lru_B={stats['lru_B']}), uniform routing in parentheses:")
    for key in STAT_KEYS:
        print(f"  {key:34s} {_show(stats.get(key)):>8s} ({_show(uniform.get(key))})")


def _show(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _int(value: str, key: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise HarnessError(f"{key}={value!r} must be a whole number") from None


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
