"""`python -m harness.real_routing dir=<traces> [grid=ar_offload|dali]`: the ar_offload or the
dali grid over every imported trace of a directory (docs/real-routing.md).

Each trace (`*.npz` written by `python -m harness.traces import`, or any trace recorded by a
live run) replays on the geometry of the model its meta names (model=hf with the config.json
it was imported with, or a built-in model), at B = each share of its experts per layer
(shares=0.25,0.5: a quarter and a half), with the GPU memory that holds the non-expert
weights, the reserve and B experts in every MoE layer, so that budgets mean the same across
models of very different sizes. One sweep per (trace, B), `+experiment=real_routing` or
`real_routing_dali`, each into out/<trace>_B<B>; then

    python -m harness.report runs=<out>

puts every cell beside the routing statistics of the trace it ran on.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from harness.accounting.budget import BYTES_PER_PARAM, GB
from harness.api import sweep
from harness.common.errors import HarnessError, exit_with
from harness.common.keyvalue import KeyValueCommand, Option, program_name
from harness.placement.trace import RoutingTrace
from harness.traces.importing import model_geometry

GRIDS = {"ar_offload": "real_routing", "dali": "real_routing_dali"}
RESERVE_GB = 0.5  # budget.reserve_gb's default

COMMAND = KeyValueCommand(
    "python -m harness.real_routing", "the ar_offload or dali grid over every imported trace of a directory",
    [Option("dir", "a directory of traces (python -m harness.traces import out=<dir>/<name>.npz)", required=True),
     Option("grid", "ar_offload (+experiment=real_routing) | dali (+experiment=real_routing_dali)", "ar_offload"),
     Option("shares", "B as shares of each model's experts per layer, comma-separated", "0.25,0.5"),
     Option("systems", "override the grid's systems (comma-separated)"),
     Option("out", "where the sweeps go, one per trace and B", "outputs/real_routing")],
    example="python -m harness.real_routing dir=traces grid=dali")


def traces_in(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise HarnessError(f"dir={directory} is not a directory; give the directory the imported traces are in")
    found = sorted(p for p in directory.glob("*.npz") if p.name != "calibration.npz")
    if not found:
        raise HarnessError(f"{directory} holds no trace (*.npz); import routing with python -m harness.traces import")
    return found


def shares_of(text: str) -> list[float]:
    try:
        shares = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        shares = []
    if not shares or not all(0 < s <= 1 for s in shares):
        raise HarnessError(f"shares={text!r} must be comma-separated fractions in (0, 1], e.g. 0.25,0.5")
    return shares


def cells(trace_path: Path, shares: list[float]) -> tuple[list[str], list[tuple[int, float]]]:
    """(the model overrides of a trace, [(B, GPU GB that holds it)])."""
    meta = RoutingTrace.load(trace_path).meta
    model, config = meta.get("model"), meta.get("config")
    if not isinstance(model, str):
        raise HarnessError(f"{trace_path} names no model in its meta; import it again with model=")
    geometry, _ = model_geometry(model, config if isinstance(config, str) else None)
    model_args = [f"model={model}", *([f"model.path={config}"] if isinstance(config, str) else [])]
    out = []
    for b in sorted({max(1, round(share * geometry.num_experts)) for share in shares}):
        need = geometry.non_expert_bytes(BYTES_PER_PARAM) + RESERVE_GB * GB \
            + b * geometry.n_moe_layers * geometry.expert_bytes(BYTES_PER_PARAM)
        out.append((b, math.ceil(need / GB * 100) / 100))
    return model_args, out


def main(argv: list[str]) -> int:
    COMMAND.prog = program_name(COMMAND.prog)
    args = COMMAND.parse(argv)
    if args["grid"] not in GRIDS:
        raise HarnessError(f"grid={args['grid']!r} is not allowed; use {' or '.join(GRIDS)}")
    shares, out = shares_of(args["shares"]), Path(args["out"])
    systems = [f"system={args['systems']}"] if args.get("systems") else []
    plan = [(path, *cells(path, shares)) for path in traces_in(Path(args["dir"]))]  # every trace checked first
    for path, model_args, budgets in plan:
        for b, gpu_gb in budgets:
            where = out / f"{path.stem}_B{b}"
            results = sweep([f"+experiment={GRIDS[args['grid']]}", *model_args, f"trace.path={path.resolve()}",
                             f"budget.experts_per_layer={b}", f"budget.gpu_gb={gpu_gb}", "tracking.enabled=false",
                             *systems], sweep_dir=where, quiet=True)
            print(f"{path.name} B={b} ({gpu_gb} GB): {len(results)} runs -> {where}")
    print(f"report: python -m harness.report runs={out}")
    return 0


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
