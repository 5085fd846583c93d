"""The ledger's accounts per phase (the forwards' kinds: prefill, decode; denoise and commit
for block diffusion), and the busy shares and hit rate DALI reports
(docs/dali-and-gem.md). Kept only when a run asks for DALI's measures
(`Ledger.track_phases`), so runs without them charge exactly as before.

Per phase and for the whole run:

  gpu_busy_share    (GPU expert seconds + non-expert seconds) / modeled seconds: the share of
                    the modeled time the GPU computes (attention, dense and shared parts run
                    on the GPU; copies are the link's, not the GPU's)
  cpu_busy_share    CPU expert seconds (busy, overlapped or not) / modeled seconds
  cpu_expert_share  CPU expert seconds / (CPU + GPU expert seconds): how the expert compute
                    is split between the two devices
  cpu_side_share    CPU expert seconds / (CPU expert + GPU expert + copy seconds): the split
                    DALI's assignment balances, whose GPU side carries the copies of the
                    experts it computes there (its Phi); DALI's "CPU/GPU busy shares" add
                    up to 100% this way
  expert_hit_rate   routed (layer, expert) pairs of a forward resident on the GPU when the
                    layer started / routed ones (each expert counted once per layer and
                    forward, whatever its tokens; miss_rate weighs by tokens)

Float tallies add their terms forward then layer, in order (ordered_sums.running_sum), so
how forwards are batched never changes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.accounting.ordered_sums import running_sum


@dataclass
class PhaseTally:
    forwards: int = 0
    modeled_s: float = 0.0
    gpu_experts_s: float = 0.0
    cpu_experts_busy_s: float = 0.0
    non_expert_s: float = 0.0
    copies_busy_s: float = 0.0
    routed_experts: int = 0
    missed_experts: int = 0


@dataclass
class ForwardFigures:
    """n charged forwards: their kinds and what the phases add up (arrays over forwards;
    gpu_s / cpu_s [n, m] per recorded layer)."""

    kinds: list[str]
    modeled_s: np.ndarray
    gpu_s: np.ndarray
    cpu_s: np.ndarray
    non_expert_s: np.ndarray
    copies_s: np.ndarray  # [n, m] the link's busy seconds per recorded layer
    routed_experts: np.ndarray
    missed_experts: np.ndarray


class PhaseTallies:
    """kind -> PhaseTally, in the order the kinds first appear."""

    def __init__(self) -> None:
        self.by_kind: dict[str, PhaseTally] = {}

    def add(self, figures: ForwardFigures) -> None:
        kinds = np.array(figures.kinds, dtype=object)
        for kind in dict.fromkeys(figures.kinds):
            rows = kinds == kind
            t = self.by_kind.setdefault(kind, PhaseTally())
            t.forwards += int(rows.sum())
            t.modeled_s = running_sum(t.modeled_s, figures.modeled_s[rows])
            t.gpu_experts_s = running_sum(t.gpu_experts_s, figures.gpu_s[rows])
            t.cpu_experts_busy_s = running_sum(t.cpu_experts_busy_s, figures.cpu_s[rows])
            t.non_expert_s = running_sum(t.non_expert_s, figures.non_expert_s[rows])
            t.copies_busy_s = running_sum(t.copies_busy_s, figures.copies_s[rows])
            t.routed_experts += int(figures.routed_experts[rows].sum())
            t.missed_experts += int(figures.missed_experts[rows].sum())

    def routed_and_missed(self) -> tuple[int, int]:
        """Routed and missed (layer, expert) pairs over every phase."""
        return (sum(t.routed_experts for t in self.by_kind.values()),
                sum(t.missed_experts for t in self.by_kind.values()))


def busy_shares(gpu_experts_s: float, cpu_busy_s: float, non_expert_s: float, copies_s: float,
                modeled_s: float) -> dict[str, float]:
    """gpu_busy_share, cpu_busy_share, cpu_expert_share, cpu_side_share (a zero
    denominator omits the figure: no NaN)."""
    out = {}
    if modeled_s > 0:
        out["gpu_busy_share"] = (gpu_experts_s + non_expert_s) / modeled_s
        out["cpu_busy_share"] = cpu_busy_s / modeled_s
    if gpu_experts_s + cpu_busy_s > 0:
        out["cpu_expert_share"] = cpu_busy_s / (gpu_experts_s + cpu_busy_s)
    if gpu_experts_s + cpu_busy_s + copies_s > 0:
        out["cpu_side_share"] = cpu_busy_s / (cpu_busy_s + gpu_experts_s + copies_s)
    return out


def hit_rate(routed: int, missed: int) -> dict[str, float]:
    return {"expert_hit_rate": (routed - missed) / routed} if routed else {}


def phase_measures(tallies: PhaseTallies) -> dict[str, float]:
    """The busy shares and hit rate of each phase, suffixed with its kind."""
    out: dict[str, float] = {}
    for kind, t in tallies.by_kind.items():
        figures = {**busy_shares(t.gpu_experts_s, t.cpu_experts_busy_s, t.non_expert_s, t.copies_busy_s,
                                 t.modeled_s),
                   **hit_rate(t.routed_experts, t.missed_experts)}
        out.update({f"{name}_{kind}": value for name, value in figures.items()})
    return out
