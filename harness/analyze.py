"""Temporal stability of expert routing, the observation TIDE rests on.

Within each block, for every MoE layer, compare the expert-load vector of a denoising
step with the one k steps later (k = 1..max_k): their cosine similarity, and the fraction
of the top-B experts (by load) that are still in the top-B set. High values mean a
placement chosen at one step stays good for the next few.

    python -m harness.analyze trace=outputs/runs/.../trace.npz [B=64] [max_k=8] [out=DIR] [format=table]

prints the table (mean over prompts, blocks and layers for each k) and the routing
statistics beside their uniform-routing values, and writes stability.csv, stability.md and
stability.png next to the trace (or into out=DIR). With format=json it prints one JSON
object with the routing statistics (harness/traces/routing_stats.py) and writes nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from harness.common.errors import HarnessError, check_output_dir, exit_with
from harness.common.keyvalue import KeyValueCommand, Option, program_name
from harness.common.paths import probe_output_dir
from harness.placement.trace import RoutingTrace
from harness.traces.routing_stats import STAT_KEYS, statistics_with_uniform
from harness.traces.stability import denoise_runs, stability_table


def plot_stability(table: pd.DataFrame, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(table["k"], table["cosine"], marker="o", label="cosine similarity of loads")
    ax.plot(table["k"], table["topB_retained"], marker="s", label="fraction of top-B kept")
    ax.set_xlabel("steps apart within a block (k)")
    ax.set_ylabel("similarity (0-1)")
    ax.set_ylim(0, 1.02)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


COMMAND = KeyValueCommand(
    "python -m harness.analyze", "temporal stability of expert routing in a trace, and its routing statistics",
    [Option("trace", "a routing trace (trace.npz of a run with trace.record=true)", required=True),
     Option("B", "experts per layer the top-B sets and statistics use", "64"),
     Option("max_k", "compare steps up to this many apart within a block", "8"),
     Option("out", "where stability.csv/.md/.png go (default: next to the trace)"),
     Option("format", "table (print and write files) or json (print the statistics, write nothing)", "table")],
    example="python -m harness.analyze trace=outputs/runs/<run>/trace.npz B=64")


def parse_args(argv: list[str]) -> dict[str, str]:
    COMMAND.prog = program_name(COMMAND.prog)
    args = COMMAND.parse(argv)
    if args["format"] not in FORMATS:
        raise HarnessError(f"format={args['format']!r} is not allowed; use table or json")
    return args


FORMATS = ("table", "json")


def statistics_lines(stats: dict) -> list[str]:
    """The routing statistics beside their uniform-routing values, one per line."""
    uniform = stats.get("uniform") or {}

    def fmt(v: object) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    lines = [f"routing statistics (B={stats['B']}): value | uniform routing"]
    lines += [f"  {key:34s} {fmt(stats.get(key)):>8s} | {fmt(uniform.get(key))}" for key in STAT_KEYS]
    cos = ", ".join(fmt(c) for c in stats.get("cosine_by_k") or [])
    ucos = ", ".join(fmt(c) for c in uniform.get("cosine_by_k") or [])
    lines.append(f"  {'cosine_by_k':34s} [{cos}] | [{ucos}]")
    return lines


def int_arg(args: dict[str, str], key: str, default: int, upper: int, what: str) -> int:
    """A positive integer argument no larger than `upper` (what the trace can give); the
    default is clipped to `upper` instead."""
    text = args.get(key, str(min(default, upper)))
    try:
        value = int(text)
    except ValueError:
        raise HarnessError(f"{key}={text!r} must be an integer") from None
    if not 1 <= value <= upper:
        raise HarnessError(f"{key}={value} must be between 1 and {upper} ({what})")
    return value


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    out = check_output_dir(args.get("out", Path(args["trace"]).parent), "out")
    if args.get("format", "table") == "table":
        probe_output_dir(out, "out", create=False)  # before any work
    trace = RoutingTrace.load(args["trace"])
    longest = max((len(run) for run in denoise_runs(trace)), default=1)
    b = int_arg(args, "B", 64, trace.n_experts, "the trace's experts per layer")
    max_k = int_arg(args, "max_k", 8, max(1, longest - 1), "the longest block's denoising steps - 1")
    stats = statistics_with_uniform(trace, b, max_k)
    if args.get("format", "table") == "json":
        decode = trace.meta.get("decode") if isinstance(trace.meta.get("decode"), dict) else {}
        print(json.dumps({"trace": args["trace"], "model": trace.meta.get("model"),
                          "weights": trace.meta.get("weights"), "decode_cache": decode.get("cache"), **stats}))
        return 0
    table = stability_table(trace, b, max_k)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "stability.csv", index=False)
    (out / "stability.md").write_text(table.to_markdown(index=False, floatfmt=".3f") + "\n")
    meta = trace.meta
    decode = meta.get("decode") if isinstance(meta.get("decode"), dict) else {}
    title = f"routing stability: {meta.get('model', '?')} ({meta.get('weights', '?')}), B={b}, " \
            f"cache={decode.get('cache', '?')}"
    plot_stability(table, out / "stability.png", title)
    print(title)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\n".join(statistics_lines(stats)))
    print(f"wrote {out / 'stability.csv'}, stability.md, stability.png")
    return 0


def cli() -> None:
    """The console script's entry point."""
    exit_with(main, sys.argv[1:])


if __name__ == "__main__":
    cli()
