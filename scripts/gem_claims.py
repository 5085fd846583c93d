"""The GEM table of docs/results/<date>-gem.md from a finished `+experiment=gem` sweep: per
model, batch size, GPU count and variability, ep_linear's and gem's modeled end-to-end latency
and p90 time per output token, gem's improvement on each, and the paper's claims beside the
harness's figures (mean and largest improvement, by variability and by GPU count, gem's gain
on its own profiling window, GEM's profiling cost).

    PYTHONPATH=. python scripts/gem_claims.py outputs/multirun/<sweep>
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean

from harness.results.run_result import RunResult

VARIABILITY = ("low", "medium", "high")


def gain(base: float, new: float) -> float:
    """How much lower `new` is than `base`, as a fraction of `base`."""
    return 1.0 - new / base


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def cells_of(sweep: Path) -> dict[tuple, dict[str, dict]]:
    cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for path in sorted(sweep.glob("*/result.json")):
        r = RunResult.from_json(path)
        c = r.config
        key = (str(r.identity.model), int(c["workload"]["batch"]), int(c["topology"]["n_gpus"]),
               str(c["topology"]["variability"]))
        cells[key][str(r.identity.system)] = r.flat_metrics()
    return cells


def summary(rows: list[dict], name: str) -> str:
    e2e = [r["e2e"] for r in rows]
    p90 = [r["p90"] for r in rows]
    return (f"| {name} | {len(rows)} | {pct(mean(e2e))} | {pct(max(e2e))} | {pct(mean(p90))} | "
            f"{pct(max(p90))} |")


def main(sweep: Path) -> None:
    cells = cells_of(sweep)
    rows = []
    print("| model | batch | GPUs | variability | e2e mean s: ep_linear / gem | gain | p90 TPOT ms: ep_linear / "
          "gem | gain |")
    print("|---|---|---|---|---|---|---|---|")
    order = sorted(cells, key=lambda k: (k[0], k[1], k[2], VARIABILITY.index(k[3])))
    for key in order:
        runs = cells[key]
        if not {"ep_linear", "gem"} <= runs.keys():
            print(f"(cell {key} is missing a system: {sorted(runs)})", file=sys.stderr)
            continue
        lin, gem = runs["ep_linear"], runs["gem"]
        row = {"key": key, "e2e": gain(lin["e2e_latency_mean_s"], gem["e2e_latency_mean_s"]),
               "p90": gain(lin["tpot_p90_s"], gem["tpot_p90_s"]), "gem": gem}
        rows.append(row)
        model, batch, gpus, var = key
        print(f"| {model} | {batch} | {gpus} | {var} | {lin['e2e_latency_mean_s']:.2f} / "
              f"{gem['e2e_latency_mean_s']:.2f} | {pct(row['e2e'])} | {1e3 * lin['tpot_p90_s']:.2f} / "
              f"{1e3 * gem['tpot_p90_s']:.2f} | {pct(row['p90'])} |")
    print("\n| cells | n | e2e gain mean | e2e gain max | p90 TPOT gain mean | p90 TPOT gain max |")
    print("|---|---|---|---|---|---|")
    print(summary(rows, "all"))
    for var in VARIABILITY:
        print(summary([r for r in rows if r["key"][3] == var], f"{var} variability"))
    for gpus in sorted({r["key"][2] for r in rows}):
        print(summary([r for r in rows if r["key"][2] == gpus], f"{gpus} GPUs"))
    for model in sorted({r["key"][0] for r in rows}):
        print(summary([r for r in rows if r["key"][0] == model], model))
    print("\n| model | GPUs | gem's gain over ep_linear on its own profiling window (min - max over cells) | "
          "profiling forwards |")
    print("|---|---|---|---|")
    for model, gpus in sorted({(r["key"][0], r["key"][2]) for r in rows}):
        window = [r["gem"]["calibration_gain"] for r in rows if r["key"][0] == model and r["key"][2] == gpus
                  and "calibration_gain" in r["gem"]]
        forwards = sorted({int(r["gem"].get("gem_profiling_forwards", 0)) for r in rows
                           if r["key"][0] == model and r["key"][2] == gpus})
        if window:
            print(f"| {model} | {gpus} | {pct(min(window))} - {pct(max(window))} | "
                  f"{', '.join(map(str, forwards))} |")
    profiled = [r["gem"] for r in rows if "gem_profile_samples" in r["gem"]]
    if profiled:
        g = profiled[0]
        print(f"\nGEM's profile: {g['gem_profile_samples']:.0f} latency samples at tile boundaries against "
              f"{g['gem_dense_profile_samples']:.0f} for a dense profile (first cell); boundary-curve error "
              f"mean {pct(mean(p['gem_profile_error_mean'] for p in profiled))}, largest "
              f"{pct(max(p['gem_profile_error_max'] for p in profiled))} over {len(profiled)} gem runs")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
