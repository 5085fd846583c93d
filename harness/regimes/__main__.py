"""`python -m harness.regimes [families=...] [out=outputs/regimes] [tracking=true] [jobs=0]`: the
regime map (docs/routing-regimes.md). Per family, routing generated at every point of locality x
skew x shared (4 x 3 x 2, plus the family's fitted anchor, conf/routing/<family>_fit.yaml),
replayed under every single-GPU system and gem vs ep_linear (topology=multi, lock-step
batches), the families side by side in worker processes (harness/common/workers.py; jobs=1:
one after another in this process); writes regimes.json (every figure), regimes.md (winners, flips, where
each paper claim holds) and per-family heatmaps (PNG, SVG), and logs them to MLflow as
artifacts of one run (experiment "routing-regimes"). Figures are modeled.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

from harness.common.errors import HarnessError, exit_with
from harness.common.files import write_atomic
from harness.common.keyvalue import KeyValueCommand, Option, program_name, whole_number
from harness.common.workers import in_workers, worker_count
from harness.regimes.grid import FAMILIES, LOCALITY, SHARED, SKEW, Cell, family_cells
from harness.regimes.maps import claims, flips, grid_cells, lead, margin, plot_family, winner
from harness.tracking.mlflow_store import default_artifact_root, ensure_experiment, open_store
from harness.tracking.settings import DEFAULT_URI

COMMAND = KeyValueCommand(
    "python -m harness.regimes", "every policy's verdict over a grid of generated routing regimes",
    [Option("families", "comma-separated models", ",".join(FAMILIES)),
     Option("out", "where the map goes", "outputs/regimes"),
     Option("seed", "the generator's seed", "0"),
     Option("tracking", "log the map to MLflow (true | false)", "true"),
     Option("jobs", "worker processes, whole families each (0: one per core; 1: in this process)", "0")],
    example="python -m harness.regimes families=mixtral out=outputs/regimes")


def markdown(family: str, cells: list[Cell]) -> str:
    grid = grid_cells(cells)
    anchor = next(c for c in cells if "anchor" in c.point)
    lines = [f"## {family} (generated routing; modeled figures)", "",
             f"Anchor (fitted): locality={anchor.point['locality']}, "
             f"{'skew (log-normal sigma)' if anchor.point.get('lognormal') else 'skew'}={anchor.point['skew']}, "
             f"shared={anchor.point['shared']}: winner **{winner(anchor)}**", "",
             "| system | tokens/s | miss rate | margin over best baseline |", "|---|---|---|---|"]
    for system, f in anchor.figures.items():
        m = f"{margin(anchor, system):+.1%}" if "/" not in system else "-"
        lines.append(f"| {system} | {f['tokens_per_s']:.2f} | {f['miss_rate']:.3f} | {m} |")
    for sh in SHARED:
        lines += ["", f"Winner, shared={sh} (rows skew, columns locality; its lead over the runner-up):", "",
                  "| skew \\ locality | " + " | ".join(str(v) for v in LOCALITY) + " |",
                  "|---" * (len(LOCALITY) + 1) + "|"]
        for sk in SKEW:
            lines.append(f"| {sk} | " + " | ".join(f"{winner(c)} ({lead(c):+.1%})" for c in
                                                   (grid[(sh, sk, lo)] for lo in LOCALITY)) + " |")
    found = flips(cells)
    lines += ["", f"Winner flips between neighbouring points ({len(found)}):", ""]
    lines += [f"- {f}" for f in found] or ["- none"]
    lines += ["", "Paper claims per point (DALI hit-rate rise over LRU; GEM gain over ep_linear low/high "
              "variability; TIDE over fiddler, tau*):", "",
              "| shared | skew | locality | DALI rise | GEM low | GEM high | TIDE gain | tau* | holds |",
              "|---|---|---|---|---|---|---|---|---|"]
    for (sh, sk, lo), cell in sorted(grid.items()):
        c = claims(cell)
        holds = ",".join(k.split("_")[0].upper() for k in ("dali_holds", "gem_holds", "tide_holds") if c[k]) or "-"
        lines.append(f"| {sh} | {sk} | {lo} | {c['dali_hit_rise']:+.3f} | {c['gem_gain_low']:+.1%} | "
                     f"{c['gem_gain_high']:+.1%} | {c['tide_gain']:+.1%} | {c['tide_tau_star']:.0f} | {holds} |")
    return "\n".join(lines) + "\n"


def log_mlflow(paths: list[Path], metrics: dict[str, float]) -> str | None:
    client = open_store(DEFAULT_URI)
    experiment = ensure_experiment(client, "routing-regimes", default_artifact_root(DEFAULT_URI))
    run = client.create_run(experiment, run_name="regime-map", tags={"routing_source": "generated"})
    for key, value in metrics.items():
        client.log_metric(run.info.run_id, key, value)
    for path in paths:
        client.log_artifact(run.info.run_id, str(path), "plots" if path.suffix in (".png", ".svg") else None)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def main(argv: list[str]) -> int:
    COMMAND.prog = program_name(COMMAND.prog)
    args = COMMAND.parse(argv)
    families = [f for f in args["families"].split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if not families or unknown:
        raise HarnessError(f"families={args['families']!r}: use some of {', '.join(FAMILIES)}")
    if args["tracking"] not in ("true", "false"):
        raise HarnessError(f"tracking={args['tracking']!r} must be true or false")
    seed = whole_number(args, "seed")
    jobs = whole_number(args, "jobs", 0, "0: one worker process per core")
    paths = build(families, Path(args["out"]), seed, jobs)
    if args["tracking"] == "true":
        print(f"mlflow run {log_mlflow(paths, {'families': float(len(families))})} (experiment routing-regimes)")
    return 0


def build(families: list[str], out: Path, seed: int = 0, jobs: int = 1) -> list[Path]:
    """Every family's cells, heatmaps, regimes.md and regimes.json under `out`; the families
    side by side in `jobs` worker processes (0: one per core), the same files either way."""
    start = time.perf_counter()

    def progress(cells: list[Cell]) -> None:
        print(f"regime map: {cells[0].family}, {len(cells)} regime points ({time.perf_counter() - start:.0f} s)")

    found = in_workers(families, partial(family_cells, seed=seed), worker_count(jobs, len(families)),
                       name="regime map", unit="family", units="families", done=progress)
    every = dict(zip(families, found, strict=True))
    paths = [path for family, cells in every.items() for path in plot_family(family, cells, out)]
    text = "# Regime map (generated routing; modeled figures)\n\n" + "\n".join(markdown(f, c) for f, c in every.items())
    data = {f: [asdict(c) for c in cells] for f, cells in every.items()}
    paths.append(write_atomic(out / "regimes.md", lambda fh: fh.write(text.encode())))
    paths.append(write_atomic(out / "regimes.json", lambda fh: fh.write(json.dumps(data, indent=1).encode())))
    print(f"regime map: wrote {len(paths)} files to {out} in {time.perf_counter() - start:.0f} s")
    return paths


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
