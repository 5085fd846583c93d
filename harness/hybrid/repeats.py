"""Warm-up and repeats for timing=measured (a device backend: cuda, or the CPU stand-in).

A measured run decodes its workload `timing.warmup` times first (discarded: kernel
compilation, allocator growth and cache warm-up land there), then `timing.repeats` times,
each with a fresh engine and executor so that every repeat starts from the same residency;
the result keeps the last repeat's engine (its modeled counters are the same in every
repeat: the decode is deterministic) and reports the median (p50) and 90th percentile (p90)
of the repeats' measured decoding times and rates. tokens_per_s is the p50 rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from harness.common.errors import HarnessError

T = TypeVar("T")


@dataclass
class TimingConfig:
    """Schema of the `timing` config node (measured runs only; a modeled run ignores it)."""

    warmup: int = 1  # decodes of the workload run first and discarded
    repeats: int = 3  # decodes measured; p50 and p90 over them

    def __post_init__(self) -> None:
        if not (isinstance(self.warmup, int) and self.warmup >= 0):
            raise HarnessError(f"timing.warmup={self.warmup} must be a whole number >= 0 (e.g. timing.warmup=1)")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise HarnessError(f"timing.repeats={self.repeats} must be a whole number >= 1 (e.g. timing.repeats=3)")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default), NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def run_repeats(decode_once: Callable[[bool], T], timing: TimingConfig) -> list[T]:
    """`warmup` calls whose results are dropped, then `repeats` calls kept; the argument says
    whether a call is the last (the one a trace records)."""
    for _ in range(timing.warmup):
        decode_once(False)
    return [decode_once(i == timing.repeats - 1) for i in range(timing.repeats)]


def repeat_figures(times_s: Sequence[float], tokens: int, timing: TimingConfig) -> dict[str, float]:
    """The measured figures over the repeats: p50 and p90 of the decoding time and of the rate
    (tokens / time; a repeat of zero seconds has no rate)."""
    rates = [tokens / t for t in times_s if t > 0]
    return {
        "measured_warmup": float(timing.warmup), "measured_repeats": float(len(times_s)),
        "measured_time_s_p50": percentile(times_s, 50), "measured_time_s_p90": percentile(times_s, 90),
        "measured_tokens_per_s_p50": percentile(rates, 50), "measured_tokens_per_s_p90": percentile(rates, 90),
    }
