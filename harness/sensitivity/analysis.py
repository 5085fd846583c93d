"""The decision rules of the sensitivity analysis, on plain numbers (no replays here).

Per cell, the systems are split into references (bounds, not contenders), baselines (what
the paper compares against) and the rest, each by the role its entry states
(systems/entry.py; the command's references= and baselines= override them). The winner
is the fastest non-reference system; the
margin is the fastest non-baseline contender's tokens/s over the best baseline's (the
paper's speedup). For each constant, walking outward from 1x over the grid, the first
factor where the winner changes (or where the margin has moved by more than `margin_move`
of its 1x value) is narrowed down by bisection in log space until the bracket is within a
factor of 1 + `tolerance`; the factor reported is the bracket's outer end, where the
change is known to hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from systems.registry import names_with_role

Speeds = dict[str, float]  # system label -> modeled tokens/s
Condition = Callable[[Speeds], bool]

MARGIN_MOVE = 0.10
TOLERANCE = 0.01


@dataclass(frozen=True)
class Roles:
    """Which systems contend and which are the baselines of the margin (default: the
    entries' roles)."""

    references: tuple[str, ...] = field(default_factory=lambda: names_with_role("reference"))
    baselines: tuple[str, ...] = field(default_factory=lambda: names_with_role("baseline"))

    def contenders(self, speeds: Speeds) -> list[str]:
        return [s for s in speeds if s not in self.references]

    def winner(self, speeds: Speeds) -> str | None:
        """The fastest contender (ties: the first in the order given)."""
        contenders = self.contenders(speeds)
        return max(contenders, key=lambda s: speeds[s]) if contenders else None

    def margin(self, speeds: Speeds) -> float:
        """Best non-baseline contender over best baseline; NaN without one of either."""
        ours = [speeds[s] for s in self.contenders(speeds) if s not in self.baselines]
        theirs = [speeds[s] for s in self.contenders(speeds) if s in self.baselines]
        if not ours or not theirs or max(theirs) <= 0:
            return math.nan
        return max(ours) / max(theirs)


def ranking(speeds: Speeds) -> list[str]:
    """Every system, fastest first."""
    return sorted(speeds, key=lambda s: -speeds[s])


@dataclass
class Crossing:
    """Where a condition first holds on one side of 1x: `factor` (None: not within the
    range), and the speeds there."""

    factor: float | None = None
    speeds: Speeds = field(default_factory=dict)


def first_crossing(speeds_at: Callable[[float], Speeds], side: Sequence[float], condition: Condition,
                   tolerance: float = TOLERANCE, probe_at: Callable[[float], Speeds] | None = None) -> Crossing:
    """`side`: the grid's factors on one side of 1, nearest 1 first. The smallest change
    (in log) at which `condition` holds, to within a factor 1 + tolerance. Between grid
    points the bisection asks `probe_at` (default `speeds_at`): it may leave out systems the
    condition does not read (the references)."""
    inside = 1.0  # the condition does not hold at 1x (the caller's base)
    for outside in side:
        speeds = speeds_at(outside)
        if condition(speeds):
            return _bisect(probe_at or speeds_at, inside, outside, speeds, condition, tolerance)
        inside = outside
    return Crossing()


def _bisect(speeds_at: Callable[[float], Speeds], inside: float, outside: float, speeds: Speeds,
            condition: Condition, tolerance: float) -> Crossing:
    while abs(math.log(outside / inside)) > math.log1p(tolerance):
        middle = math.sqrt(inside * outside)
        at_middle = speeds_at(middle)
        if condition(at_middle):
            outside, speeds = middle, at_middle
        else:
            inside = middle
    return Crossing(outside, speeds)


@dataclass
class ConstantResult:
    """One constant of one cell: speeds on the grid and where the conclusions change."""

    constant: str
    grid: dict[float, Speeds]
    winner_down: Crossing
    winner_up: Crossing
    margin_down: Crossing
    margin_up: Crossing

    def smallest(self, which: str) -> float | None:
        """The factor nearest 1x (in log) that flips the winner ("winner") or moves the
        margin ("margin"), either direction."""
        found = [c.factor for c in (getattr(self, f"{which}_down"), getattr(self, f"{which}_up"))
                 if c.factor is not None]
        return min(found, key=lambda f: abs(math.log(f))) if found else None


def analyse_constant(constant: str, factors: Sequence[float], speeds_at: Callable[[float], Speeds], roles: Roles,
                     margin_move: float = MARGIN_MOVE, tolerance: float = TOLERANCE,
                     probe_at: Callable[[float], Speeds] | None = None) -> ConstantResult:
    """Speeds at every grid factor, and the four crossings (winner / margin, down / up);
    `probe_at`: the contenders' speeds only, for the bisections (default `speeds_at`)."""
    base = speeds_at(1.0)
    grid = {f: speeds_at(f) for f in factors}
    base_winner, base_margin = roles.winner(base), roles.margin(base)

    def flips(speeds: Speeds) -> bool:
        return roles.winner(speeds) != base_winner

    def moves(speeds: Speeds) -> bool:
        margin = roles.margin(speeds)
        return not math.isnan(base_margin) and abs(margin / base_margin - 1) > margin_move

    down = sorted((f for f in factors if f < 1), reverse=True)
    up = sorted(f for f in factors if f > 1)
    return ConstantResult(
        constant, grid,
        first_crossing(speeds_at, down, flips, tolerance, probe_at),
        first_crossing(speeds_at, up, flips, tolerance, probe_at),
        first_crossing(speeds_at, down, moves, tolerance, probe_at),
        first_crossing(speeds_at, up, moves, tolerance, probe_at),
    )


def tornado(results: Sequence[ConstantResult], roles: Roles) -> list[tuple[str, float, float]]:
    """(constant, margin at the lowest factor, margin at the highest factor), the constants
    that move the margin most first."""
    rows = []
    for r in results:
        low, high = min(r.grid), max(r.grid)
        rows.append((r.constant, roles.margin(r.grid[low]), roles.margin(r.grid[high])))
    base = roles.margin(results[0].grid[1.0]) if results else math.nan

    def spread(row: tuple[str, float, float]) -> float:
        moved = [abs(math.log(m / base)) for m in row[1:] if m > 0 and base > 0 and not math.isnan(m)]
        return max(moved, default=0.0)

    return sorted(rows, key=spread, reverse=True)
