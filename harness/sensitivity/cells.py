"""One cell's sensitivity: every system's tokens/s with each constant scaled, and where the
conclusions change (harness/sensitivity/analysis.py decides, the replayers replay)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness.accounting.cost import HardwareConfig
from harness.sensitivity.analysis import ConstantResult, Roles, Speeds, analyse_constant
from harness.sensitivity.replayer import JobReplayer
from harness.sensitivity.scaling import constants_for, part_of, scaled


@dataclass
class CellResult:
    name: str
    base: Speeds  # tokens/s at the profile the sweep ran with
    recorded: Speeds  # tokens/s the sweep's results recorded (base must equal it)
    constants: list[ConstantResult]
    hardware: str
    replays: int = 0
    recharges: int = 0
    seconds: float = 0.0
    estimates: dict[str, str] = field(default_factory=dict)  # constant -> its source, for estimated ones
    skipped: Speeds = field(default_factory=dict)  # systems not replayed: their recorded 1x tokens/s


def cell_speeds(replayers: dict[str, JobReplayer], hw: HardwareConfig, constant: str,
                labels: Sequence[str] | None = None, memo: dict[tuple[str, str], float] | None = None
                ) -> Callable[[float], Speeds]:
    """factor -> the tokens/s of every system (or of `labels`) with `constant` scaled by it
    (memoised per system and profile in `memo`, which the cell's constants share: 1x is
    the same profile for each; a job that cannot depend on the constant keeps its 1x
    figure)."""
    memo = {} if memo is None else memo
    chosen = list(labels) if labels is not None else list(replayers)

    def one(label: str, factor: float) -> float:
        replayer = replayers[label]
        if factor != 1.0 and replayer.never_uses(part_of(constant)):
            factor = 1.0
        profile = scaled(hw, constant, factor)
        key = (label, repr(profile))  # every field, floats to the bit
        if key not in memo:
            memo[key] = replayer.tokens_per_s(profile)
        return memo[key]

    return lambda factor: {label: one(label, factor) for label in chosen}


def analyse_cell(name: str, replayers: dict[str, JobReplayer], recorded: Speeds, factors: Sequence[float],
                 roles: Roles, constants: Sequence[str] | None = None, margin_move: float = 0.10,
                 tolerance: float = 0.01) -> CellResult:
    start = time.perf_counter()
    hw = next(iter(replayers.values())).spec.hardware
    chosen = list(constants) if constants else constants_for(hw)
    contenders = [label for label in replayers if label not in roles.references]
    results = []
    memo: dict[tuple[str, str], float] = {}  # the bisections' probes reuse the grid's figures, constants 1x
    for c in chosen:
        results.append(analyse_constant(c, factors, cell_speeds(replayers, hw, c, memo=memo), roles, margin_move,
                                        tolerance, cell_speeds(replayers, hw, c, contenders, memo)))
    base = results[0].grid[1.0] if results else {k: r.tokens_per_s(hw) for k, r in replayers.items()}
    estimates = hw.estimates()
    return CellResult(name, base, recorded, results, hw.name,
                      replays=sum(r.replays for r in replayers.values()),
                      recharges=sum(r.recharges for r in replayers.values()),
                      seconds=time.perf_counter() - start,
                      estimates={c: estimates[c] for c in chosen if c in estimates})


def base_mismatches(cell: CellResult, rel: float = 1e-9) -> list[str]:
    """Systems whose 1x replay differs from what the sweep recorded (should be none)."""
    return [s for s, v in cell.recorded.items()
            if s in cell.base and not math.isclose(cell.base[s], v, rel_tol=rel)]
