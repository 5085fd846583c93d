"""`python -m harness.sensitivity sweep=<sweep dir>`: how robust is a sweep's ranking to the
hardware constants it was charged with? (docs/sensitivity.md)

    python -m harness -m +experiment=table1                  # the sweep (replays)
    python -m harness.sensitivity sweep=outputs/multirun/<time>
    python -m harness.sensitivity sweep=... scales=0.25,4,9 constants=cpu_tflops,pcie_gbps out=DIR

Options (key=value): sweep (required), out (default <sweep>/sensitivity), scales
(low,high,points; default 0.25,4,5: 0.25, 0.5, 1, 2, 4, log-spaced, 1 always included), constants (default: all
that charge the sweep's profile), references and baselines (default: the systems whose
entry has that role, systems/entry.py), margin_move (0.10), tolerance (0.05: bisection to
5%), tracking (true: log under the sweep's MLflow parent run), shortcut (true: re-charge
recorded outcomes where a system's decisions cannot have changed; false: replay
everything), skip (default: the systems whose replays are costly by their entry, listed
with their 1x figure; skip= replays them too), jobs (0: one worker process per
core, at most one per cell; 1: every cell in this process, the least memory).
Replays only: nothing is decoded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from harness.common.errors import HarnessError, exit_with
from harness.common.keyvalue import KeyValueCommand, Option, program_name
from harness.job.config import register_configs
from harness.sensitivity.analysis import Roles
from harness.sensitivity.cells import CellResult
from harness.sensitivity.mlflow_log import log_to_parent
from harness.sensitivity.output import write_outputs
from harness.sensitivity.scaling import scale_grid
from harness.sensitivity.sweep import Cell, load_sweep
from harness.sensitivity.workers import CellSettings, analyse_cells
from systems.registry import costly_replays, names_with_role


def command() -> KeyValueCommand:
    """The command's options, the role and skip defaults from the registered entries."""
    return KeyValueCommand("python -m harness.sensitivity", "replay a sweep with each hardware constant scaled: "
                           "which one flips the ranking", [
        Option("sweep", "the sweep dir (outputs/multirun/<time>); required", ""),
        Option("out", "where the tables and plots go (empty: <sweep>/sensitivity)", ""),
        Option("scales", "low,high,points, log-spaced, 1 always included", "0.25,4,5"),
        Option("constants", "the constants to scale (empty: all that charge the sweep's profile)", ""),
        Option("references", "systems shown but never the winner", ",".join(names_with_role("reference"))),
        Option("baselines", "the winner's margin is over the best of these", ",".join(names_with_role("baseline"))),
        Option("margin_move", "a margin change that counts as a flip", "0.10"),
        Option("tolerance", "bisection tolerance on the flipping factor", "0.05"),
        Option("tracking", "log under the sweep's MLflow parent run", "true"),
        Option("shortcut", "re-charge recorded outcomes where decisions cannot have changed", "true"),
        Option("skip", "systems not replayed (listed with their 1x figure)", ",".join(costly_replays())),
        Option("jobs", "worker processes, whole cells each (0: one per core; 1: in this process, least memory)", "0"),
    ], example="python -m harness.sensitivity sweep=outputs/multirun/<time>")


def parse(argv: list[str]) -> dict[str, str]:
    parser = command()
    parser.prog = program_name(parser.prog)
    options = parser.parse(argv)
    if not options["sweep"]:
        raise HarnessError("python -m harness.sensitivity needs sweep=<sweep dir> (outputs/multirun/<time>)")
    return options


def _floats(text: str, key: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HarnessError(f"{key}={text!r} must be numbers separated by commas") from None


def _flag(text: str, key: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise HarnessError(f"{key}={text!r} must be true or false")
    return text.lower() == "true"


def _count(text: str, key: str) -> int:
    if not text.isdigit():
        raise HarnessError(f"{key}={text!r} must be a whole number (0: one per core)")
    return int(text)


def _progress(result: CellResult) -> None:
    print(f"{result.name}: {result.replays} replays, {result.recharges} re-charges, {result.seconds:.1f} s",
          file=sys.stderr)


def check_comparable(cells: list[Cell], roles: Roles, sweep: Path) -> None:
    """At least one cell holds a contender and a baseline: the margin compares them, so a
    sweep of one system (or of baselines only) has no figure to analyse (every margin nan)."""
    for cell in cells:
        contenders = [s for s in cell.jobs if s not in roles.references]
        if any(s in roles.baselines for s in contenders) and any(s not in roles.baselines for s in contenders):
            return
    systems = ", ".join(sorted({s for c in cells for s in c.jobs}))
    raise HarnessError(f"sweep={sweep} holds system {systems} only; sensitivity needs a cell with a contender and one "
                       f"of the baselines ({', '.join(roles.baselines) or 'none given'}) to compare: sweep them "
                       "together (system=tide,fiddler) or set baselines= to systems of the sweep")


def main(argv: list[str]) -> int:
    options = parse(argv)
    register_configs()
    scales = _floats(options["scales"], "scales")
    if len(scales) != 3:
        raise HarnessError(f"scales={options['scales']!r} must be low,high,points (e.g. 0.25,4,9)")
    factors = scale_grid(scales[0], scales[1], int(scales[2]))
    roles = Roles(tuple(s for s in options["references"].split(",") if s),
                  tuple(s for s in options["baselines"].split(",") if s))
    constants = [c for c in options["constants"].split(",") if c] or None
    margin_move, tolerance = _floats(options["margin_move"], "margin_move")[0], _floats(options["tolerance"],
                                                                                      "tolerance")[0]
    sweep = Path(options["sweep"])
    out = Path(options["out"]) if options["out"] else sweep / "sensitivity"
    command = "python -m harness.sensitivity " + " ".join(argv)
    skip = frozenset(s for s in options["skip"].split(",") if s)
    settings = CellSettings(tuple(factors), roles, tuple(constants) if constants else None, margin_move, tolerance,
                            _flag(options["shortcut"], "shortcut"), skip)
    jobs, tracking = _count(options["jobs"], "jobs"), _flag(options["tracking"], "tracking")  # checked before any work
    start = time.perf_counter()
    loaded = load_sweep(sweep)
    check_comparable(loaded, roles, sweep)
    cells = analyse_cells(loaded, settings, jobs, _progress)
    files = write_outputs(cells, roles, out, command, factors)
    print((out / "sensitivity.md").read_text())
    if tracking:
        log_to_parent(sweep, cells, roles, files)
    print(f"wrote {', '.join(str(f) for f in files)} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
