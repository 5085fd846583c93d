"""Tables from finished runs: a sweep's summary and the paper-style comparison.

`python -m harness.report [--from-mlflow URI | --runs DIR ...] [--out DIR]` collects
results (result.json files under run or sweep directories, or the runs of an MLflow
store), and writes `report.md`, `report.csv` (wide), `report_long.csv` (tidy) and the
figures of `harness.report.plots` (PNG, PDF and SVG each):

  rows     (model, gen_length, block_length, budget) plus every other setting that differs
           within the runs read (budget.gpu_gb, workload, weights, decode.threshold,
           budget.scope, hardware.name, ...: harness/report/keys.py), each shown as a column;
           report.md labels them as the paper does, gen_length-B-budget (B: experts per
           layer, e.g. 256-64-10GB)
  columns  one group per system, labelled with the options that differ between its runs
           (`tide (tau=4)`; a system charged against its original's overlap is its own
           column: tide with system.overlap=false is tide_sequential): tokens/s, speedup
           over the best baseline in the row (baselines: fiddler, mixtral_offload as charged
           by the original; gpu_only and oracle are references), miss rate, host-to-GPU GB,
           tau* (systems that report one) and lossless

Runs that agree on every setting are one measurement: the newer is used and a warning on
stderr names the older.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness.common.errors import HarnessError, OneLineParser, check_output_dir
from harness.common.keyvalue import as_flags, program_name
from harness.common.paths import file_kind, probe_output_dir
from harness.job.resume import RESUMED_FILE, resumed_result_path
from harness.report import plots
from harness.report.breakdown import breakdown_by_window, breakdown_markdown
from harness.report.keys import Keyed, keyed_runs
from harness.report.measures import measures_markdown
from harness.report.notes import early_stop_markdown, replay_routing_markdown, tau_flatness_markdown
from harness.results.records import (
    RECORD_METRICS,
    _int,
    _pct,
    _yes_no,
    record_from_result,
    system_order,
)
from harness.results.run_result import RunIdentity, RunResult, Timing
from harness.traces.routing_stats import STAT_KEYS
from harness.tracking.mlflow_store import open_store
from harness.tracking.run_files import RESULT_FILE, find_files
from harness.tracking.uris import check_store_is_mlflow, check_tracking_uri

BASELINES = ("fiddler", "mixtral_offload")
TABLE_METRICS = ["tokens_per_s", "speedup", "miss_rate", "io_gb", "tau_star", "ttft_s", "tpot_s", "lossless"]
# shown only for the systems (and runs) that report them: tau* (tide), and an autoregressive
# run's time to first token and per output token (prefill and decode apart)
SOMETIMES = ("tau_star", "ttft_s", "tpot_s")
SWEEP_COLUMNS = ["job", "overrides", "status", "system", "budget", "model", "gen_length", "block_length",
                 "decode_cache", "tau", "tokens_per_s", "miss_rate", "io_gb", "cpu_expert_tokens", "tau_star",
                 "lossless", "token_match_rate", "wall_tokens_per_s", "timing"]
LABELS = {"tokens_per_s": "tok/s", "speedup": "speedup", "miss_rate": "miss", "tau_star": "tau*",
          "lossless": "lossless", "wall_tokens_per_s": "wall tok/s", "io_gb": "io GB",
          "cpu_expert_tokens": "cpu tokens", "token_match_rate": "match", "gen_length": "gen",
          "block_length": "block", "decode_cache": "cache", "ttft_s": "ttft ms", "tpot_s": "tpot ms"}


# --------------------------------------------------------------------------- records


def records_from_dirs(roots: list[Path]) -> list[dict[str, Any]]:
    """Every result.json (and resume pointer) under the roots, one record per distinct result."""

    seen: dict[str, dict[str, Any]] = {}
    for path in [*find_files(roots, RESULT_FILE), *find_files(roots, RESUMED_FILE)]:
        target = path if path.name != RESUMED_FILE else resumed_result_path(path.parent)
        if target is None or not target.is_file() or str(target.resolve()) in seen:
            continue
        try:
            result = RunResult.from_json(target)
        except (OSError, ValueError, TypeError, AttributeError, KeyError, HarnessError):
            continue  # a damaged file, or a JSON value that is not a result object, is not a run
        seen[str(target.resolve())] = record_from_result(result, str(target), order=target.stat().st_mtime)
    return list(seen.values())


def records_from_mlflow(uri: str, experiments: list[str] | None = None) -> list[dict[str, Any]]:
    """Job runs of an MLflow store, from their result.json artifact (params/metrics otherwise)."""

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run otherwise
    client = open_store(uri)
    everything = client.search_experiments()
    unknown = sorted(set(experiments or []) - {e.name for e in everything})
    if unknown:  # not "no runs found": the name is wrong, not the store empty
        names = ", ".join(sorted(e.name for e in everything)) or "none"
        raise HarnessError(f"--experiment {unknown[0]}: no such experiment in {uri} (it has: {names})")
    exps = [e for e in everything if not experiments or e.name in experiments]
    records = []
    token = None
    while exps:
        page = client.search_runs([e.experiment_id for e in exps], max_results=1000, page_token=token)
        for run in page:
            if run.data.tags.get("harness.kind") == "job":
                records.append(_record_from_mlflow_run(client, run))
        token = page.token
        if not token:
            break
    return records


def _record_from_mlflow_run(client: Any, run: Any) -> dict[str, Any]:
    run_id, order = run.info.run_id, run.info.start_time / 1000
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = RunResult.from_json(client.download_artifacts(run_id, "result.json", tmp))
        return record_from_result(result, f"mlflow:{run_id}", order=order)
    except Exception:  # no artifact: rebuild what the table needs from params, tags and metrics
        p, t = run.data.params, run.data.tags
        identity = RunIdentity(system=t.get("system"), model=t.get("model"), hardware=t.get("hardware"),
                               decode_cache=t.get("decode_cache"), weights=t.get("weights"))
        config = config_from_params(p)
        result = RunResult(identity=identity, config=config, budget={"name": t.get("budget")},
                           metrics=dict(run.data.metrics), timing=Timing(t.get("timing")))
        return record_from_result(result, f"mlflow:{run_id}", order=order)


def config_from_params(params: Mapping[str, str]) -> dict[str, Any]:
    """The nested config back from MLflow's flattened params (`decode.gen_length` -> decode:
    gen_length), with integers and booleans restored, so that the run's settings read as its
    result.json's would."""
    config: dict[str, Any] = {}
    for key, text in params.items():
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[leaf] = {"True": True, "False": False, "null": None, "None": None}.get(text, _int(text))
    return config


# --------------------------------------------------------------------------- sweep summary


def _job_number(name: str) -> tuple[int, str]:
    found = re.match(r"(\d+)", name)
    return (int(found.group(1)) if found else 1 << 30, name)


def _job_overrides(job_dir: Path) -> dict[str, str]:
    try:
        items = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
    except (OSError, yaml.YAMLError):
        return {}
    return dict(str(o).split("=", 1) for o in items if "=" in str(o))


def varying_overrides(overrides: list[dict[str, str]]) -> list[str]:
    """'key=value' per job for the keys whose value differs between the jobs of a sweep."""
    keys = sorted({k for o in overrides for k in o})
    varying = [k for k in keys if len({o.get(k) for o in overrides}) > 1]
    return [" ".join(f"{k}={o[k]}" for k in varying if k in o) for o in overrides]


def sweep_records(sweep_dir: Path) -> list[dict[str, Any]]:
    """One record per job directory of a sweep: ok, skipped (resume) or failed."""

    records = []
    job_dirs = sorted({p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")},
                      key=lambda d: _job_number(str(d.relative_to(sweep_dir))))
    labels = varying_overrides([_job_overrides(d) for d in job_dirs])
    for job, varies in zip(job_dirs, labels, strict=True):
        prior = resumed_result_path(job)
        path, status = (job / "result.json", "ok") if (job / "result.json").is_file() else (prior, "skipped")
        try:
            record = record_from_result(RunResult.from_json(path), str(path), status=status)
        except (OSError, ValueError, TypeError, AttributeError):
            record = record_from_result(RunResult(RunIdentity()), str(job), status="failed")
        records.append({**record, "job": _job_number(job.name)[0], "overrides": varies})
    return records


def sweep_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(records)
    return df.reindex(columns=SWEEP_COLUMNS)


# --------------------------------------------------------------------------- paper table


def with_speedups(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """speedup = tokens/s over the best baseline of the same row (NaN where the row has none);
    a baseline is fiddler or mixtral_offload charged as the original (its plain label)."""
    baselines = df[df["system_label"].isin(BASELINES)]
    best = baselines.groupby(keys)["tokens_per_s"].max().rename("best_baseline")
    out = df.join(best, on=keys)
    return out.assign(speedup=out["tokens_per_s"] / out["best_baseline"]).drop(columns="best_baseline")


def _order_key(index: pd.Index) -> pd.Index:
    if index.name == "budget":  # 10GB < 18GB < 30GB < custom
        return index.map(lambda b: (float(m.group(1)) if (m := re.match(r"([\d.]+)", str(b))) else math.inf, str(b)))
    return index.map(str)


def paper_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows by row keys (keys.py: the fixed ones and every differing setting), columns
    (system, metric); tau* kept only for systems that report one."""
    return pivot(keyed_runs(records))


def pivot(keyed: Keyed) -> pd.DataFrame:
    keys = keyed.keys
    df = with_speedups(keyed.frame, keys)
    wide = df.pivot(index=keys, columns="system", values=TABLE_METRICS).swaplevel(axis=1)
    columns = [(s, m) for s in system_order(list(df["system"].unique())) for m in TABLE_METRICS
               if m not in SOMETIMES or wide[(s, m)].notna().any()]
    return wide.reindex(columns=pd.MultiIndex.from_tuples(columns, names=["system", "metric"])).sort_index(
        key=_order_key)


def long_frame(keyed: Keyed) -> pd.DataFrame:
    """The tidy table: one row per (row key, system, metric) with its value and the run it came
    from; metrics a run does not report are left out."""
    df = with_speedups(keyed.frame, keyed.keys)
    metrics = [m for m in [*TABLE_METRICS, *RECORD_METRICS] if m in df and m not in keyed.keys]
    metrics = list(dict.fromkeys(metrics))
    long = df.melt(id_vars=[*keyed.keys, "system", "system_name", "source"], value_vars=metrics,
                   var_name="metric", value_name="value")
    long = long[long["value"].notna()]
    return long.sort_values([*keyed.keys, "system", "metric"], key=lambda c: c.map(str), kind="stable")


def flat_csv_frame(wide: pd.DataFrame) -> pd.DataFrame:
    flat = wide.copy()
    flat.columns = [f"{s}.{m}" for s, m in wide.columns]
    return flat.reset_index()


FORMATS: dict[str, Callable[[float], str]] = {
    "tokens_per_s": lambda x: f"{x:.1f}", "wall_tokens_per_s": lambda x: f"{x:.1f}",
    "speedup": lambda x: f"{x:.2f}x", "miss_rate": _pct, "token_match_rate": _pct, "tau_star": lambda x: f"{x:g}",
    "lossless": _yes_no, "io_gb": lambda x: f"{x:.3f}", "cpu_expert_tokens": lambda x: f"{x:g}",
    "ttft_s": lambda x: f"{1e3 * x:.1f}", "tpot_s": lambda x: f"{1e3 * x:.2f}",
}


def _cell(metric: str, value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if metric in FORMATS and isinstance(value, int | float):
        return FORMATS[metric](float(value))
    return "-" if value is None else str(value)


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"


def experts_per_row(keyed: Keyed) -> dict[tuple[Any, ...], Any]:
    """Row key -> B, the experts per layer its runs held (the largest, if they differ)."""
    df = keyed.frame
    if "experts" not in df:
        return {}
    held = pd.to_numeric(df["experts"], errors="coerce")
    best = held.groupby([df[k] for k in keyed.keys]).max().dropna()
    return {(k if isinstance(k, tuple) else (k,)): int(v) for k, v in best.items()}


def paper_markdown(wide: pd.DataFrame, experts: Mapping[tuple[Any, ...], Any] | None = None) -> str:
    """The table; rows labelled gen_length-B-budget (the paper's cells) in a first column
    that replaces the gen and budget columns; every other row key is a column of its own."""
    keys = list(wide.index.names)
    rest = [k for k in keys if k not in ("gen_length", "budget")]
    headers = ["cell", *(LABELS.get(k, k) for k in rest)] + [f"{s} {LABELS[m]}" for s, m in wide.columns]
    rows = []
    for idx, row in wide.iterrows():
        idx = idx if isinstance(idx, tuple) else (idx,)
        at = dict(zip(keys, idx, strict=True))
        b = (experts or {}).get(idx, "?")
        rows.append([f"{at['gen_length']}-{b}-{at['budget']}", *(str(at[k]) for k in rest)]
                    + [_cell(m, row[(s, m)]) for s, m in wide.columns])
    return markdown(headers, rows)


def sweep_markdown(table: pd.DataFrame) -> str:
    columns = [c for c in table.columns if table[c].notna().any()]
    return markdown([LABELS.get(c, c) for c in columns],
                    [[_cell(c, row[c]) for c in columns] for _, row in table.iterrows()])


# --------------------------------------------------------------------------- CLI


def write_report(records: list[dict[str, Any]], out: Path) -> tuple[str, list[Path]]:
    """report.md, report.csv (wide: a row per row key, `<system>.<metric>` columns),
    report_long.csv (tidy: a row per row key, system and metric) and the figures; the
    warnings about same-key runs are printed on stderr once."""
    out.mkdir(parents=True, exist_ok=True)
    keyed = keyed_runs(records)
    for line in keyed.warnings:
        print(line, file=sys.stderr)
    wide = pivot(keyed)
    text = (paper_markdown(wide, experts_per_row(keyed)) + measures_markdown(records) + early_stop_markdown(records)
            + routing_markdown(records) + replay_routing_markdown(records, [LABELS.get(k, k) for k in ROUTING_KEYS])
            + tau_flatness_markdown(records) + breakdown_markdown(records))
    note = plots.timing_note(records)
    (out / "report.md").write_text(f"# Offloading comparison{note}\n\n{text}")
    flat_csv_frame(wide).to_csv(out / "report.csv", index=False)
    long_frame(keyed).to_csv(out / "report_long.csv", index=False)
    return text, [*plots.all_figures(records, out), *breakdown_by_window(records, out)]


ROUTING_KEYS = ["model", "weights", "decode_cache", "gen_length", "block_length"]


def routing_of(record: dict[str, Any]) -> str:
    """Which routing a row's statistics describe: a live run's own recording, or the file an
    imported trace came from (docs/real-routing.md)."""
    source = record.get("routing_source")
    if source == "generated":  # a named regime's routing (docs/routing-regimes.md)
        regime = (record.get("routing") or {}).get("regime") or {}
        return f"generated: {regime.get('name') or Path(str(record.get('trace'))).name}"
    return f"{source}: {Path(str(record.get('trace'))).name}" if source else "recorded"


def routing_markdown(records: list[dict[str, Any]]) -> str:
    """The routing statistics of the runs that recorded a trace, each beside its value under
    uniform routing; one row per (model, weights, cache, gen, block, B, routing source): every system of a
    live run routes exactly like gpu_only, so the latest run stands for the row."""
    rows: dict[tuple, dict[str, Any]] = {}
    for record in sorted((r for r in records if r.get("routing")), key=lambda r: r.get("order", 0)):
        stats = record["routing"]
        rows[(*(record.get(k) for k in ROUTING_KEYS), stats.get("B"), routing_of(record))] = record
    if not rows:
        return ""

    def cell(value: Any, uniform: Any) -> str:
        show = "n/a" if value is None else f"{value:.3g}"
        return show if uniform is None else f"{show} ({uniform:.3g})"

    headers = [LABELS.get(k, k) for k in ROUTING_KEYS] + ["B", *STAT_KEYS, "cosine k=1..3", "routing"]
    lines = []
    for key, record in rows.items():
        stats, uniform = record["routing"], record["routing"].get("uniform") or {}
        cos = ", ".join("n/a" if c is None else f"{c:.2f}" for c in (stats.get("cosine_by_k") or [])[:3])
        lines.append([str(v) for v in key[:-1]] + [cell(stats.get(k), uniform.get(k)) for k in STAT_KEYS]
                     + [cos, key[-1]])
    return ("\n## Routing statistics (uniform routing in parentheses)\n\n" + markdown(headers, lines))


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line on stderr and 2."""
    try:
        return run_report(sys.argv[1:] if argv is None else argv)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


REPORT_FLAGS = {"from_mlflow": "--from-mlflow", "experiment": "--experiment", "runs": "--runs", "out": "--out"}


def report_parser() -> OneLineParser:
    prog = program_name("python -m harness.report")
    parser = OneLineParser(
        prog=prog, description="paper-style table, tidy CSV and figures from finished runs",
        usage=f"{prog} [runs=DIR ...] [from_mlflow=URI] [experiment=NAME ...] [out=DIR]",
        epilog="Arguments are key=value, as every harness command takes them (the --flags below are the same "
               "options; a bare directory is runs=). Example: harness-report runs=outputs/multirun out=outputs/report")
    parser.add_argument("--from-mlflow", metavar="URI", help="from_mlflow=URI: read the runs of this tracking store")
    parser.add_argument("--experiment", action="append", help="experiment=NAME: only this MLflow experiment "
                                                              "(repeatable)")
    parser.add_argument("--runs", nargs="+", action="extend", type=Path, metavar="DIR",
                        help="runs=DIR: run or sweep dirs (repeatable; default: outputs)")
    parser.add_argument("--out", type=Path, default=Path("outputs/report"), help="out=DIR: output dir "
                                                                                 "(default: %(default)s)")
    return parser


def run_report(argv: list[str]) -> int:
    parser = report_parser()
    # a bare directory is what `python -m harness.report outputs/multirun/<time>` means: runs=
    argv = [f"runs={a}" if "=" not in a and not a.startswith("-") and Path(a).is_dir()
            and not (i and argv[i - 1].startswith("-")) else a for i, a in enumerate(argv)]  # not a flag's value
    args = parser.parse_args(as_flags(argv, REPORT_FLAGS))
    if args.from_mlflow and args.runs:
        parser.error("use either --from-mlflow or --runs")
    check_output_dir(args.out, "--out")
    if args.from_mlflow:
        check_report_uri(args.from_mlflow)
    roots = args.runs or [Path("outputs")]
    missing = [str(r) for r in roots if not r.exists()] if not args.from_mlflow else []
    if missing:
        raise HarnessError(f"--runs: no such directory: {', '.join(missing)}")
    where = args.from_mlflow or " ".join(map(str, roots))
    probe_output_dir(args.out, "--out", create=False)  # now, not after reading every run
    try:
        records = records_from_mlflow(args.from_mlflow, args.experiment) if args.from_mlflow else \
            records_from_dirs(roots)
    except HarnessError:
        raise
    except Exception as exc:
        raise HarnessError(f"cannot read runs from {where}: {' '.join(str(exc).split())[:300]}") from None
    if not records:
        raise HarnessError(f"no runs found in {where}")
    text, figures = write_report(records, args.out)
    print(text, end="")
    print(f"wrote {args.out}/report.md, report.csv, report_long.csv and {len(figures)} figure(s) "
          f"(PNG, PDF, SVG each) from {len(records)} runs")
    return 0


def check_report_uri(uri: str) -> None:
    """A well-formed URI, and for SQLite a file that exists (MLflow would create an empty store)."""

    check_tracking_uri(uri, "--from-mlflow")
    if uri.startswith("sqlite:///") and file_kind(Path(uri[len("sqlite:///"):])) == "missing":
        raise HarnessError(f"--from-mlflow {uri}: no such SQLite store")
    check_store_is_mlflow(uri, "--from-mlflow")


if __name__ == "__main__":
    sys.exit(main())
