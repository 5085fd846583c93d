"""Report sections beside the paper table (harness/report/tables.py), each keyed by the
table's own rows (harness/report/keys.py: the same cell and settings columns, same-key runs
already reduced to the newer):

- routing statistics: of the runs that recorded a trace (beside uniform routing), and of
  replay runs, computed from the trace the run replayed (live runs record theirs in
  result.json; a replay has none), without the uniform-routing reference (its random trace
  is as large as the replayed one: `python -m harness.traces.routing_stats`);
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
from harness.report.keys import Keyed, as_keyed, cell_headers, cell_values, experts_per_row, rows_of
from harness.report.markdown import pipe_table
from harness.results.records import system_order
from harness.traces.routing_stats import STAT_KEYS, routing_statistics

Record = dict[str, Any]
LABELS = {"gen_length": "gen", "block_length": "block", "decode_cache": "cache"}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _newest(part: Any, has: str) -> Record | None:
    """The newest run of a row that has `has` (a routing recording, a trace, ...)."""
    runs = [r for r in part.sort_values("order", kind="stable").to_dict("records") if r.get(has)]
    return runs[-1] if runs else None


def routing_of(record: Record) -> str:
    """Which routing a row's statistics describe: a live run's own recording, or the file an
    imported trace came from (docs/real-routing.md)."""
    source = record.get("routing_source")
    if source == "generated":  # a named regime's routing (docs/routing-regimes.md)
        regime = (record.get("routing") or {}).get("regime") or {}
        return f"generated: {regime.get('name') or Path(str(record.get('trace'))).name}"
    return f"{source}: {Path(str(record.get('trace'))).name}" if source else "recorded"


def _cosines(stats: dict[str, Any], digits: int) -> str:
    return ", ".join("n/a" if c is None else f"{c:.{digits}f}" for c in (stats.get("cosine_by_k") or [])[:3])


def routing_markdown(runs: Keyed | list[Record]) -> str:
    """The routing statistics of the rows whose runs recorded a trace, each beside its value
    under uniform routing; one line per row of the table (every system of a live run routes
    exactly like gpu_only, so the row's newest recording stands for it)."""
    keyed = as_keyed(runs)
    experts = experts_per_row(keyed)
    lines = []
    for _, part in rows_of(keyed):
        record = _newest(part, "routing")
        if record is None:
            continue
        stats, uniform = record["routing"], record["routing"].get("uniform") or {}

        def cell(key: str, stats: dict[str, Any] = stats, uniform: dict[str, Any] = uniform) -> str:
            value, base = stats.get(key), uniform.get(key)
            show = "n/a" if value is None else f"{value:.3g}"
            return show if base is None else f"{show} ({base:.3g})"

        lines.append([*cell_values(keyed, record, experts), stats.get("B"), *(cell(k) for k in STAT_KEYS),
                      _cosines(stats, 2), routing_of(record)])
    if not lines:
        return ""
    headers = [*cell_headers(keyed, LABELS), "B", *STAT_KEYS, "cosine k=1..3", "routing"]
    return "\n## Routing statistics (uniform routing in parentheses)\n\n" + pipe_table(headers, lines)


def replay_routing(runs: Keyed | list[Record]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Row key -> routing statistics of the trace its newest replay run replayed (at that
    run's B), for the rows no live run recorded; each (trace file, B) is read once."""
    keyed = as_keyed(runs)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    done: dict[tuple[str, int], dict[str, Any] | None] = {}
    for values, part in rows_of(keyed):
        if _newest(part, "routing") is not None:
            continue
        record = _newest(part, "trace")
        if record is None or not _number(record.get("experts")):
            continue
        key = (str(record["trace"]), int(record["experts"]))
        if key not in done:
            done[key] = _statistics(Path(key[0]), key[1])
        if done[key] is not None:
            out[values] = {**done[key], "record": record}
    return out


def _statistics(path: Path, b: int) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return routing_statistics(RoutingTrace.load(path), max(1, b))
    except HarnessError:
        return None


def replay_routing_markdown(runs: Keyed | list[Record]) -> str:
    keyed = as_keyed(runs)
    rows = replay_routing(keyed)
    if not rows:
        return ""
    experts = experts_per_row(keyed)
    lines = []
    for stats in rows.values():
        cells = ["n/a" if stats.get(k) is None else f"{stats[k]:.3g}" for k in STAT_KEYS]
        lines.append([*cell_values(keyed, stats["record"], experts), stats["record"]["experts"], *cells,
                      _cosines(stats, 3)])
    headers = [*cell_headers(keyed, LABELS), "B", *STAT_KEYS, "cosine k=1..3"]
    return ("\n## Routing statistics of the replayed traces (no uniform reference: "
            "python -m harness.traces.routing_stats <trace> B gives it)\n\n" + pipe_table(headers, lines))


def _runs_in_order(keyed: Keyed) -> list[Record]:
    """The kept runs, row by row in the table's order, systems in the registry's order."""
    out = []
    for _, part in rows_of(keyed):
        by_system = {str(r["system"]): r for r in part.to_dict("records")}
        out += [by_system[s] for s in system_order(list(by_system))]
    return out


def tau_flatness_markdown(runs: Keyed | list[Record]) -> str:
    """Per run with a tau* curve: tau*, the curve's minimum and maximum and its spread
    (max - min) / min, and the objective at tau = 1 over the minimum."""
    keyed = as_keyed(runs)
    experts = experts_per_row(keyed)
    lines = []
    for r in _runs_in_order(keyed):
        if not isinstance(r.get("tau_curve"), list) or not r["tau_curve"]:
            continue
        curve = [float(x) for x in r["tau_curve"]]
        low, high = min(curve), max(curve)
        spread = (high - low) / low if low > 0 else math.nan
        tau = r.get("tau_star")
        lines.append([*cell_values(keyed, r, experts), r["system"], f"{tau:g}" if _number(tau) else "-",
                      f"{low:.4g} / {high:.4g}", f"{100 * spread:.1f}%", f"{curve[0] / low:.3f}x"])
    if not lines:
        return ""
    headers = [*cell_headers(keyed, LABELS), "system", "tau*", "objective min / max (s per block per layer)",
               "spread over tau", "tau=1 over min"]
    return ("\n## tau*: how flat its objective is over tau = 1..T (a flat curve makes tau* a weak choice)\n\n"
            + pipe_table(headers, lines))


def early_stop_markdown(runs: Keyed | list[Record]) -> str:
    """Runs that decoded fewer tokens than they asked for (EOS early stop): requested_tokens,
    or prompts x gen_length for a result that predates it."""
    keyed = as_keyed(runs)
    experts = experts_per_row(keyed)
    lines = []
    for r in _runs_in_order(keyed):
        decoded, prompts, gen = r.get("generated_tokens"), r.get("prompts"), r.get("gen_length")
        if not all(_number(v) for v in (decoded, prompts, gen)):
            continue
        requested = r.get("requested_tokens")
        asked = requested if _number(requested) else prompts * gen
        if decoded < asked:
            where = ", ".join(cell_values(keyed, r, experts))
            lines.append(f"- {where} {r['system']}: decoded {decoded:g} of {asked:g} tokens (stopped at EOS)")
    if not lines:
        return ""
    return "\n## Decodes that stopped early at EOS (their tokens/s covers fewer tokens)\n\n" + "\n".join(lines) + "\n"
