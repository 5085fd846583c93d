"""Tables from finished runs: the paper-style comparison (a sweep's summary: sweep.py).

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
           over the best baseline in the row (the systems whose entry's role is baseline, as
           charged by their original: systems/entry.py), miss rate, host-to-GPU GB,
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

from harness.common.errors import HarnessError, OneLineParser, check_output_dir
from harness.common.interrupts import end_startup
from harness.common.keyvalue import as_flags, program_name
from harness.common.paths import file_kind, probe_output_dir
from harness.job.resume import RESUMED_FILE, resumed_result_path
from harness.report import plots
from harness.report.breakdown import breakdown_by_window, breakdown_markdown
from harness.report.keys import Keyed, experts_per_row, keyed_runs
from harness.report.markdown import pipe_table
from harness.report.measures import measures_markdown
from harness.report.notes import (
    early_stop_markdown,
    replay_routing_markdown,
    routing_markdown,
    tau_flatness_markdown,
)
from harness.report.uncertainty import ERRORS, half_width
from harness.results.records import (
    RECORD_METRICS,
    _int,
    _pct,
    _yes_no,
    record_from_result,
    system_order,
)
from harness.results.run_result import RunIdentity, RunResult, Timing
from harness.tracking.mlflow_store import open_store
from harness.tracking.run_files import RESULT_FILE, find_files
from harness.tracking.uris import check_store_is_mlflow, check_tracking_uri
from systems.registry import names_with_role

TABLE_METRICS = ["tokens_per_s", "tokens_per_s_ci", "speedup", "miss_rate", "io_gb", "tau_star", "ttft_s", "tpot_s",
                 "lossless"]
# shown only for the systems (and runs) that report them: tau* (tide), and an autoregressive
# run's time to first token and per output token (prefill and decode apart)
SOMETIMES = ("tokens_per_s_ci", "tau_star", "ttft_s", "tpot_s")
LABELS = {"tokens_per_s": "tok/s", "tokens_per_s_ci": "±95% CI (prompts)",
          "speedup": "speedup", "miss_rate": "miss", "tau_star": "tau*",
          "lossless": "lossless", "wall_tokens_per_s": "wall tok/s", "io_gb": "io GB",
          "cpu_expert_tokens": "cpu tokens", "token_match_rate": "match", "gen_length": "gen",
          "block_length": "block", "decode_cache": "cache", "ttft_s": "ttft ms", "tpot_s": "tpot ms"}


# --------------------------------------------------------------------------- records


def harness_result(path: Path) -> RunResult:
    """The run result at `path`, or a ValueError when the file is JSON but not a result of this
    harness (another tool's result.json): one without its system and its metrics."""
    result = RunResult.from_json(path)
    if not (isinstance(result.identity.system, str) and result.identity.system and result.metrics):
        raise ValueError("not a result of this harness (it has no system and metrics)")
    return result


def records_from_dirs(roots: list[Path], skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Every result.json (and resume pointer) under the roots, one record per distinct result;
    a file that is not a result of this harness is left out, with a line in `skipped`."""

    seen: dict[str, dict[str, Any]] = {}
    for path in [*find_files(roots, RESULT_FILE), *find_files(roots, RESUMED_FILE)]:
        target = path if path.name != RESUMED_FILE else resumed_result_path(path.parent)
        if target is None or not target.is_file() or str(target.resolve()) in seen:
            continue
        try:
            result = harness_result(target)
        except (OSError, ValueError, TypeError, AttributeError, KeyError, HarnessError) as exc:
            # a damaged file, or a JSON value that is not this harness's result, is not a run: never a ?-?-? row
            if skipped is not None:
                skipped.append(f"{target}: {' '.join(str(exc).split())[:200]}")
            continue
        seen[str(target.resolve())] = record_from_result(result, str(target.resolve()), order=target.stat().st_mtime)
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


# --------------------------------------------------------------------------- paper table


def with_speedups(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """speedup = tokens/s over the best baseline of the same row (NaN where the row has none);
    a baseline is a system whose entry's role is baseline, charged as the original (its plain
    label)."""
    baselines = df[df["system_label"].isin(names_with_role("baseline"))]
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


def with_intervals(df: pd.DataFrame) -> pd.DataFrame:
    """tokens_per_s_ci: the half width of the 95% confidence interval of each run's tokens/s,
    over its prompts (harness/report/uncertainty.py; NaN under two prompts)."""
    return df.assign(tokens_per_s_ci=[half_width(r, "tokens_per_s") for r in df.to_dict("records")])


def pivot(keyed: Keyed) -> pd.DataFrame:
    keys = keyed.keys
    df = with_intervals(with_speedups(keyed.frame, keys))
    wide = df.pivot(index=keys, columns="system", values=TABLE_METRICS).swaplevel(axis=1)
    columns = [(s, m) for s in system_order(list(df["system"].unique())) for m in TABLE_METRICS
               if m not in SOMETIMES or wide[(s, m)].notna().any()]
    return wide.reindex(columns=pd.MultiIndex.from_tuples(columns, names=["system", "metric"])).sort_index(
        key=_order_key)


def long_frame(keyed: Keyed) -> pd.DataFrame:
    """The tidy table: one row per (row key, system, metric) with its value and the run it came
    from; metrics a run does not report are left out."""
    df = with_intervals(with_speedups(keyed.frame, keyed.keys))
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
    "tokens_per_s": lambda x: f"{x:.1f}", "tokens_per_s_ci": lambda x: f"±{x:.1f}",
    "wall_tokens_per_s": lambda x: f"{x:.1f}",
    "speedup": lambda x: f"{x:.2f}x", "miss_rate": _pct, "token_match_rate": _pct, "tau_star": lambda x: f"{x:g}",
    "lossless": _yes_no, "io_gb": lambda x: f"{x:.3f}", "cpu_expert_tokens": lambda x: f"{x:g}",
    "ttft_s": lambda x: f"{1e3 * x:.1f}", "tpot_s": lambda x: f"{1e3 * x:.2f}",
}


def cell_text(metric: str, value: Any) -> str:
    value = value.item() if hasattr(value, "item") else value  # a numpy number as Python's
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if metric in FORMATS and isinstance(value, int | float):
        return FORMATS[metric](float(value))
    return "-" if value is None else str(value)


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
                    + [cell_text(m, row[(s, m)]) for s, m in wide.columns])
    return pipe_table(headers, rows)


# --------------------------------------------------------------------------- CLI


def write_report(records: list[dict[str, Any]], out: Path, errors: str = "ci") -> tuple[str, list[Path]]:
    """report.md, report.csv (wide: a row per row key, `<system>.<metric>` columns),
    report_long.csv (tidy: a row per row key, system and metric) and the figures; the
    warnings about same-key runs are printed on stderr once."""
    out.mkdir(parents=True, exist_ok=True)
    keyed = keyed_runs(records)
    for line in keyed.warnings:
        print(line, file=sys.stderr)
    wide = pivot(keyed)
    # every section and figure takes the table's own rows (keyed): one cell key for the report
    text = (paper_markdown(wide, experts_per_row(keyed)) + measures_markdown(keyed) + early_stop_markdown(keyed)
            + routing_markdown(keyed) + replay_routing_markdown(keyed) + tau_flatness_markdown(keyed)
            + breakdown_markdown(keyed))
    note = plots.timing_note(records)
    (out / "report.md").write_text(f"# Offloading comparison{note}\n\n{text}")
    flat_csv_frame(wide).to_csv(out / "report.csv", index=False)
    long_frame(keyed).to_csv(out / "report_long.csv", index=False)
    return text, [*plots.all_figures(keyed, out, errors), *breakdown_by_window(keyed, out)]


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line on stderr and 2."""
    end_startup()  # the imports are done: Ctrl-C is the command's own from here
    try:
        return run_report(sys.argv[1:] if argv is None else argv)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


REPORT_FLAGS = {"from_mlflow": "--from-mlflow", "experiment": "--experiment", "runs": "--runs", "out": "--out",
                "errors": "--errors"}


def report_parser() -> OneLineParser:
    prog = program_name("python -m harness.report")
    parser = OneLineParser(
        prog=prog, description="paper-style table, tidy CSV and figures from finished runs",
        usage=f"{prog} [runs=DIR ...] [from_mlflow=URI] [experiment=NAME ...] [out=DIR] [errors=ci|sd]",
        epilog="Arguments are key=value, as every harness command takes them (the --flags below are the same "
               "options; a bare directory is runs=). Example: harness-report runs=outputs/multirun out=outputs/report")
    parser.add_argument("--from-mlflow", metavar="URI", help="from_mlflow=URI: read the runs of this tracking store")
    parser.add_argument("--experiment", action="append", help="experiment=NAME: only this MLflow experiment "
                                                              "(repeatable)")
    parser.add_argument("--runs", nargs="+", action="extend", type=Path, metavar="DIR",
                        help="runs=DIR: run or sweep dirs (repeatable; default: outputs)")
    parser.add_argument("--out", type=Path, default=Path("outputs/report"), help="out=DIR: output dir "
                                                                                 "(default: %(default)s)")
    parser.add_argument("--errors", choices=ERRORS, default="ci",
                        help="errors=ci|sd: the figures' error bars, 95%% CI of the mean over prompts (default) or "
                             "the prompts' spread (1 s.d.)")
    return parser


def run_report(argv: list[str]) -> int:
    parser = report_parser()
    # a bare directory is what `python -m harness.report outputs/multirun/<time>` means: runs=
    argv = [f"runs={a}" if "=" not in a and not a.startswith("-") and Path(a).is_dir()
            and not (i and argv[i - 1].startswith("-")) else a for i, a in enumerate(argv)]  # not a flag's value
    args = parser.parse_args(as_flags(argv, REPORT_FLAGS, parser.prog))
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
    skipped: list[str] = []
    try:
        records = records_from_mlflow(args.from_mlflow, args.experiment) if args.from_mlflow else \
            records_from_dirs(roots, skipped)
    except HarnessError:
        raise
    except Exception as exc:
        raise HarnessError(f"cannot read runs from {where}: {' '.join(str(exc).split())[:300]}") from None
    if not records:
        also = f" (skipped {len(skipped)} that are not this harness's runs: {skipped[0]})" if skipped else ""
        raise HarnessError(f"no runs found in {where}{also}")
    for line in skipped:  # one line each, never a ?-?-? row
        print(f"warning: skipped {line}", file=sys.stderr)
    text, figures = write_report(records, args.out, args.errors)
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
