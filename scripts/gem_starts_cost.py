"""What GEM's default starts would cost the regime map (docs/routing-regimes.md): per family,
the two gem cells (low and high variability) replayed on the anchor's generated trace with
`system.starts=1` (the map's setting) and with GEM's default, CPU seconds and modeled times.

    OMP_NUM_THREADS=1 python scripts/gem_starts_cost.py [family ...]
"""

from __future__ import annotations

import sys
import time

from harness.cli.overrides import compose_checked
from harness.job.config import register_configs
from harness.regimes import grid
from harness.routing.generate import Dims
from harness.routing.params import RegimeFile
from harness.routing.replayable import generate_with_calibration, mode_of


def gem_configs(family: str, starts: list[str]) -> dict[str, object]:
    register_configs()
    base = [f"model={family}", "source=trace", "routing=recorded", "tracking.enabled=false", "show_text=false",
            *grid.budget_overrides(family), "system=gem", "topology=multi", f"workload.batch={grid.BATCH}"]
    return {v: compose_checked([*base, f"topology.variability={v}", *starts]) for v in ("low", "high")}


def main(families: list[str]) -> None:
    for family in families or list(grid.FAMILIES):
        fitted, sizes = grid.anchor(family), grid.SIZES[mode_of(family)]
        for label, starts in (("starts=1", [f"system.starts={grid.GEM_STARTS}"]), ("default", [])):
            cfgs = gem_configs(family, starts)
            cfg = cfgs["low"]
            trace, calibration = generate_with_calibration(
                RegimeFile(fitted.regime, fitted.shape, {}, f"{family}_anchor"), family, None, 0, 2,
                sizes["requests"], sizes["prompt"], sizes["gen"], cfg.decode.block_length, cfg.decode.cache,
                Dims.of_model(family))
            start = time.process_time()
            modeled = {v: grid.replay(c, trace, calibration)["modeled_time_s"] for v, c in cfgs.items()}
            print(f"{family} {label} (starts {cfg.system.starts}): {time.process_time() - start:.2f} s CPU, modeled "
                  f"low {modeled['low']:.4f} s, high {modeled['high']:.4f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
