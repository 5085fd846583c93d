"""Report sections beside the paper table (harness/report/tables.py):

- routing statistics of replay runs: computed from the trace the run replayed (live runs
  record theirs in result.json; a replay has none), without the uniform-routing reference
  (its random trace is as large as the replayed one: `python -m harness.traces.routing_stats`);
- tau* and how flat its curve is: the spread of TIDE's objective over tau = 1..T, since a
  flat curve makes tau* a near-arbitrary pick;
- decodes that stopped early at EOS: fewer tokens than prompts x gen_length, so their
  tokens/s covers a shorter generation than the cell's label says.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.common.errors import HarnessError
from harness.placement.trace import RoutingTrace
from harness.traces.routing_stats import STAT_KEYS, routing_statistics

Record = dict[str, Any]


def replay_routing(records: list[Record]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """(model, weights, cache, gen, block, B) -> routing statistics of a replayed trace, for
    the rows no live run covers (one statistics per trace file and B)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    done: dict[tuple[str, int], dict[str, Any] | None] = {}
    for r in sorted(records, key=lambda r: r.get("order", 0)):
        path, b = r.get("trace"), r.get("experts")
        if r.get("routing") or not path or not isinstance(b, int | float) or math.isnan(b):
            continue
        key = (str(path), int(b))
        if key not in done:
            done[key] = _statistics(Path(path), int(b))
        if done[key] is not None:
            out[(r.get("model"), r.get("weights"), r.get("decode_cache"), r.get("gen_length"), r.get("block_length"),
                 int(b))] = done[key]
    return out


def _statistics(path: Path, b: int) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return routing_statistics(RoutingTrace.load(path), max(1, b))
    except HarnessError:
        return None


def replay_routing_markdown(records: list[Record], headers: list[str]) -> str:
    rows = replay_routing(records)
    if not rows:
        return ""
    lines = ["| " + " | ".join([*headers, "B", *STAT_KEYS, "cosine k=1..3"]) + " |",
             "|" + "---|" * (len(headers) + len(STAT_KEYS) + 2)]
    for key, stats in rows.items():
        cos = ", ".join("n/a" if c is None else f"{c:.3f}" for c in (stats.get("cosine_by_k") or [])[:3])
        cells = ["n/a" if stats.get(k) is None else f"{stats[k]:.3g}" for k in STAT_KEYS]
        lines.append("| " + " | ".join([*(str(v) for v in key), *cells, cos]) + " |")
    return ("\n## Routing statistics of the replayed traces (no uniform reference: "
            "python -m harness.traces.routing_stats <trace> B gives it)\n\n" + "\n".join(lines) + "\n")


def tau_flatness_markdown(records: list[Record]) -> str:
    """Per run with a tau* curve: tau*, the curve's minimum and maximum and its spread
    (max - min) / min, and the objective at tau = 1 over the minimum."""
    rows = [r for r in records if r.get("tau_curve")]
    if not rows:
        return ""
    lines = ["| cell | system | tau* | objective min / max (s per block per layer) | spread over tau | "
             "tau=1 over min |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (str(r.get("model")), r.get("gen_length") or 0, str(r.get("budget")),
                                         str(r.get("system")))):
        curve = [float(x) for x in r["tau_curve"]]
        low, high = min(curve), max(curve)
        spread = (high - low) / low if low > 0 else math.nan
        tau = r.get("tau_star")
        lines.append(f"| {r.get('gen_length')}-{r.get('budget')} | {r.get('system')} | "
                     f"{'-' if tau is None or (isinstance(tau, float) and math.isnan(tau)) else f'{tau:g}'} | "
                     f"{low:.4g} / {high:.4g} | {100 * spread:.1f}% | {curve[0] / low:.3f}x |")
    return ("\n## tau*: how flat its objective is over tau = 1..T (a flat curve makes tau* a weak choice)\n\n"
            + "\n".join(lines) + "\n")


def early_stop_markdown(records: list[Record]) -> str:
    """Runs that decoded fewer tokens than they asked for (EOS early stop): requested_tokens,
    or prompts x gen_length for a result that predates it."""
    lines = []
    for r in sorted(records, key=lambda r: (str(r.get("model")), r.get("gen_length") or 0, str(r.get("budget")),
                                            str(r.get("system")))):
        decoded, prompts, gen = r.get("generated_tokens"), r.get("prompts"), r.get("gen_length")
        if not all(isinstance(v, int | float) and not math.isnan(v) for v in (decoded, prompts, gen)):
            continue
        requested = r.get("requested_tokens")
        asked = requested if isinstance(requested, int | float) and not math.isnan(requested) else prompts * gen
        if decoded < asked:
            lines.append(f"- {r.get('model')} {gen}-{r.get('budget')} {r.get('system')}: decoded {decoded:g} of "
                         f"{asked:g} tokens (stopped at EOS)")
    if not lines:
        return ""
    return "\n## Decodes that stopped early at EOS (their tokens/s covers fewer tokens)\n\n" + "\n".join(lines) + "\n"
