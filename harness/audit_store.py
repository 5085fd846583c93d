"""Check what a sweep left in a tracking store against what it left on disk.

    python -m harness.audit_store SWEEP_DIR --uri URI --jobs N

The sweep's parent run is the one recorded in SWEEP_DIR/mlflow_parent.json for URI. The
check passes when:

  - the store holds exactly one parent run for this sweep dir (tag `sweep_dir`), that one,
    and it ended FINISHED;
  - it has exactly N active children, every one FINISHED;
  - each of the N job dirs (SWEEP_DIR/<num> with a result.json, or a resumed.json naming
    one) is the `run_dir` of exactly one child: every job logged, none twice;
  - each child's metrics equal the numeric metrics of its job's result.json.

It prints one line (`ok: ...` or `FAILED: <every problem>`) and exits 0 or 1; the shell
check (scripts/cluster_check.sh) and its tests use it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.common.files import read_json
from harness.job.mlflow_log import parent_run_id
from harness.job.resume import resumed_result_path
from harness.results.run_result import CONSTANT_METRICS, param_value
from harness.tracking.mlflow_store import normalize_uri, open_store
from harness.tracking.run_files import RESULT_FILE


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """What tracking logs of result.json's metrics as MLflow metrics (RunResult.to_mlflow):
    every number, as float, but the constants (logged as params)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and k not in CONSTANT_METRICS}


def constant_params(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The result's constants as MLflow params."""
    return {k: param_value(v) for k, v in metrics.items() if k in CONSTANT_METRICS and isinstance(v, int | float)}


@dataclass
class StoreReport:
    parent_run_id: str | None = None
    children: int = 0
    jobs: int = 0
    metrics_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        if self.ok:
            return (f"ok: parent {self.parent_run_id} FINISHED, {self.children} children for {self.jobs} jobs, "
                    f"each logged once, {self.metrics_checked} metrics equal to result.json")
        return "FAILED: " + "; ".join(self.problems)


def job_dirs(sweep_dir: Path) -> dict[Path, Path]:
    """{job dir: the result.json it stands for} for the numbered job dirs of a sweep."""
    found = {}
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()):
        if (job / RESULT_FILE).is_file():
            found[job.resolve()] = job.resolve() / RESULT_FILE
        elif (prior := resumed_result_path(job)) is not None:
            found[job.resolve()] = prior
    return found


def metric_differences(logged: Mapping[str, float], result: Mapping[str, Any],
                       params: Mapping[str, str] | None = None) -> list[str]:
    """Names of the result's numeric metrics that the run lacks or holds with another value
    (the constants among its params, when `params` are given)."""
    expected = numeric_metrics(result.get("metrics") or {})
    differing = [k for k, v in expected.items() if k not in logged or not _same(float(logged[k]), v)]
    if params is not None:
        differing += [k for k, v in constant_params(result.get("metrics") or {}).items() if params.get(k) != v]
    return sorted(differing)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def compare(parents: list[Any], parent_id: str | None, children: list[Any], jobs: dict[Path, Path]) -> StoreReport:
    """The check itself, on runs already fetched (MLflow Run objects or look-alikes)."""
    report = StoreReport(parent_run_id=parent_id, children=len(children), jobs=len(jobs))
    if parent_id is None:
        report.problems.append("no parent run recorded in mlflow_parent.json for this URI")
    if len(parents) != 1 or (parent_id is not None and parents[0].info.run_id != parent_id):
        report.problems.append(f"{len(parents)} parent runs for this sweep dir, expected exactly the recorded one")
    elif parents[0].info.status != "FINISHED":
        report.problems.append(f"parent run is {parents[0].info.status}, not FINISHED")
    unfinished = [c.info.run_id for c in children if c.info.status != "FINISHED"]
    if unfinished:
        report.problems.append(f"{len(unfinished)} children not FINISHED: {', '.join(unfinished)}")
    by_dir = Counter(str(Path(c.data.tags.get("run_dir", "?"))) for c in children)
    twice = sorted(d for d, n in by_dir.items() if n > 1)
    if twice:
        report.problems.append(f"logged more than once: {', '.join(twice)}")
    missing = sorted(str(d) for d in jobs if str(d) not in by_dir)
    if missing:
        report.problems.append(f"job dirs without a child run: {', '.join(missing)}")
    strays = sorted(d for d in by_dir if Path(d) not in jobs)
    if strays:
        report.problems.append(f"children of no job dir of this sweep: {', '.join(strays)}")
    for child in children:
        job = Path(child.data.tags.get("run_dir", "?"))
        if job not in jobs:
            continue
        result = read_json(jobs[job])
        differing = metric_differences(child.data.metrics, result, getattr(child.data, "params", None))
        if differing:
            report.problems.append(f"{job.name}: logged metrics differ from result.json: {', '.join(differing)}")
        else:
            report.metrics_checked += len(numeric_metrics(result.get("metrics") or {}))
    return report


def check_sweep(sweep_dir: Path, uri: str, expected_jobs: int) -> StoreReport:
    """Fetch the sweep's runs from the store and compare them with the sweep dir."""
    sweep_dir = sweep_dir.resolve()
    jobs = job_dirs(sweep_dir)
    client = open_store(uri)
    parent_id = parent_run_id(sweep_dir, uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    parents = _all_runs(client, experiments, f"tags.`harness.kind` = 'sweep' and tags.sweep_dir = '{sweep_dir}'")
    children = _all_runs(client, experiments, f"tags.`mlflow.parentRunId` = '{parent_id}'") if parent_id else []
    report = compare(parents, parent_id, children, jobs)
    if len(jobs) != expected_jobs:
        report.problems.insert(0, f"{len(jobs)} job dirs with a result, expected {expected_jobs}")
    return report


def _all_runs(client: Any, experiments: list[str], query: str) -> list[Any]:
    runs, token = [], None
    while True:
        page = client.search_runs(experiments, query, max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.audit_store", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--uri", required=True, help="tracking URI the sweep logged to")
    parser.add_argument("--jobs", type=int, required=True, help="how many jobs the sweep has")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"error: no such sweep dir: {args.sweep_dir}", file=sys.stderr)
        return 2
    report = check_sweep(args.sweep_dir, args.uri, args.jobs)
    print(f"store {normalize_uri(args.uri)}, sweep {args.sweep_dir}: {report.line()}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
