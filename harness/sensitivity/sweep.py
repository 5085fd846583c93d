"""The jobs of a finished replay sweep, grouped into cells, ready to be replayed again.

A job is a directory of the sweep holding `.hydra/overrides.yaml` and `result.json`; its
config is composed again from those overrides (so the replays see exactly what the job
saw), its trace is the one its result names, its calibration the cached one. A cell is the
set of jobs whose overrides agree except for the system (`system=` and `system.*`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.decode.loading import LoadedModel
from harness.job.artifacts import calibration_trace
from harness.job.config import HarnessConfig
from harness.job.replay import recorded_steps, require_request_tokens
from harness.job.setup import setup_run
from harness.placement.trace import RoutingTrace
from harness.results.records import system_label
from harness.results.run_result import RunResult
from harness.sensitivity.replayer import JobReplayer, JobSpec, trace_loads
from harness.traces.serving import lockstep
from harness.tracking.run_files import RESULT_FILE
from harness.zoo.entry import nominal_geometry


@dataclass
class SweepJob:
    run_dir: Path
    label: str  # the report's system name (records.py system_label: the entry's report labels, options)
    cell_overrides: tuple[str, ...]
    cfg: HarnessConfig
    result: RunResult


@dataclass
class Cell:
    """The jobs of one setting, one per system label."""

    overrides: tuple[str, ...]
    jobs: dict[str, SweepJob] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """gen_length-B-budget as the paper labels it (else the overrides)."""
        some = next(iter(self.jobs.values()))
        decode, budget = some.result.config.get("decode") or {}, some.result.budget
        if decode.get("gen_length") and budget.get("name"):
            return f"{decode['gen_length']}-{budget.get('experts_per_layer', '?')}-{budget['name']}"
        return " ".join(self.overrides) or "cell"


def _is_system_override(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("+~")
    return key == "system" or key.startswith("system.")


def load_sweep(sweep_dir: Path) -> list[Cell]:
    """The sweep's cells (in job order). Jobs without a result (failed) are skipped; a live
    job is refused: sensitivity replays traces."""
    if not sweep_dir.is_dir():
        raise HarnessError(f"sweep={sweep_dir}: no such directory; give a sweep dir (outputs/multirun/<time>)")
    cells: dict[tuple[str, ...], Cell] = {}
    job_dirs = sorted((p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")),
                      key=lambda d: (len(d.name), d.name))
    for run_dir in job_dirs:
        if not (run_dir / RESULT_FILE).is_file():
            continue
        overrides = [str(o) for o in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or []]
        result = RunResult.from_json(run_dir / RESULT_FILE)
        if result.identity.source != "trace":
            raise HarnessError(f"job {run_dir} ran live; sensitivity replays traces: run the sweep with source=trace "
                               "(every +experiment does)")
        cfg = compose_checked(overrides)
        label = system_label(result.identity.system, result.config.get("system") or {}) or "?"
        key = tuple(o for o in overrides if not _is_system_override(o))
        cell = cells.setdefault(key, Cell(key))
        if label in cell.jobs:
            raise HarnessError(f"cell {' '.join(key)} holds system {label} twice ({cell.jobs[label].run_dir} and "
                               f"{run_dir}); give one sweep dir per grid")
        cell.jobs[label] = SweepJob(run_dir, label, key, cfg, result)
    if not cells:
        raise HarnessError(f"sweep={sweep_dir} holds no finished job (no */result.json); run the sweep first")
    return list(cells.values())


def _no_model() -> LoadedModel:
    raise HarnessError("a calibration trace is missing from the cache (cache_dir); run the sweep again to record it")


def replayer_for(job: SweepJob, traces: dict[str, RoutingTrace], loads: dict[str, np.ndarray]) -> JobReplayer:
    """The job's replayer; traces (and their loads) are shared between the jobs of a cell (by path)."""
    cfg, result = job.cfg, job.result
    if cfg.workload.arrivals != "static":  # when requests join depends on every forward's time, so on the profile
        raise HarnessError(f"job {job.run_dir} serves requests as they arrive (workload.arrivals="
                           f"{cfg.workload.arrivals}), whose batches depend on the hardware profile; the sensitivity "
                           "analysis re-charges fixed forwards: run it over a sweep with workload.arrivals=static")
    geometry = nominal_geometry(cfg.model)
    setup = setup_run(cfg, geometry)
    path = result.identity.trace
    if not path or not Path(path).is_file():
        raise HarnessError(f"job {job.run_dir}: its trace {path} is gone; run the sweep again to record it")
    batch = cfg.workload.batch
    key = path if batch == 1 else f"{path}#batch={batch}"  # a job served in lock-step replays the batched trace
    if key not in traces:
        trace = RoutingTrace.load(Path(path))
        if batch > 1:  # as the job's replay served it (harness/job/replay.py)
            require_request_tokens(trace, Path(path))
            trace = lockstep(trace, batch).trace
        traces[key] = trace
    trace = traces[key]
    if key not in loads:
        loads[key] = trace_loads(trace)
    calibration = None
    if setup.needs_calibration:  # the file the job named, else (older results) the cached one by key
        named = result.identity.calibration
        calibration = RoutingTrace.load(Path(named)) if named and Path(named).is_file() else \
            calibration_trace(cfg, cfg.decode, _no_model)
        if batch > 1:  # what the system learnt from was batched the same way
            calibration = lockstep(calibration, batch).trace
    metrics = result.flat_metrics()
    spec = JobSpec(cfg.system, geometry, setup.budget.experts_per_layer, setup.budget.scope, setup.hardware, trace,
                   calibration, recorded_steps(trace, Path(path), cfg.decode.steps), int(metrics["generated_tokens"]),
                   loads[key])
    return JobReplayer(spec)
