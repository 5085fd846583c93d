"""How sure a figure is: the 95% confidence interval of a run's mean over its prompts
(Student t), or the prompts' spread (one standard deviation), from the per-prompt figures
of harness/results/records.py `per_prompt` (each prompt's modeled tokens/s and miss rate).

The half width is that of the mean of the per-prompt figures; it is drawn around the run's
own figure (its tokens over its total time, a ratio of sums, which weights long prompts
more), not around that mean. The interval is over prompts, not over repeated runs: a
modeled figure comes from a deterministic trace and cost model, so a rerun gives the same
number; what varies is the prompt. A run with fewer than two prompts (or no per-prompt series, as a measured one) has
no interval (NaN).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

ERRORS = ("ci", "sd")  # the report's `errors=` choices: 95% CI of the mean (default), per-prompt spread

# Student t's 0.975 quantile by degrees of freedom (standard tables); between two entries and
# past 120 (towards the normal's 1.96) linear in 1/df, within 1e-3 of the exact quantile
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
        29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df: int) -> float:
    """Student t's 0.975 quantile at `df` degrees of freedom (df >= 1)."""
    if df in T975:
        return T975[df]
    low = max(k for k in T975 if k < df)
    high, at_high = min((k for k in T975 if k > df), default=math.inf), 1.960
    if high in T975:
        at_high = T975[high]
    share = (1 / low - 1 / df) / (1 / low - (0.0 if high == math.inf else 1 / high))
    return T975[low] + share * (at_high - T975[low])


def prompt_values(record: dict[str, Any], metric: str) -> list[float]:
    """The metric of each of the run's prompts (NaNs left out)."""
    values = [p.get(metric, math.nan) for p in record.get("per_prompt") or []]
    return [float(v) for v in values if isinstance(v, int | float) and not math.isnan(v)]


def half_width(record: dict[str, Any], metric: str, errors: str = "ci") -> float:
    """The error bar's half length: t * s / sqrt(n) (ci) or s (sd); NaN under two prompts."""
    values = prompt_values(record, metric)
    if len(values) < 2:
        return math.nan
    sd = statistics.stdev(values)
    return sd if errors == "sd" else t975(len(values) - 1) * sd / math.sqrt(len(values))


def caption(errors: str, records: list[dict[str, Any]]) -> str:
    """What the bars are, for a figure's title: the interval, over how many prompts, and,
    for modeled figures, that it is over prompts and not repeated runs."""
    counts = sorted({len(prompt_values(r, "tokens_per_s")) for r in records} - {0, 1})
    n = f"n = {', '.join(map(str, counts))} prompts" if counts else "no run has two prompts: no bars"
    if errors == "sd":
        what = f"Error bars: ±1 s.d. across prompts ({n}), the prompts' spread, not an uncertainty of the mean"
    else:  # the half width is the per-prompt mean's; the bar is the run's tokens over its total time
        what = (f"Error bars: half width of the 95% CI of the mean over prompts (Student t, {n}), "
                "around the run's figure")
    if any(str(r.get("timing")) == "modeled" for r in records):
        what += "; over prompts, not repeated runs (a modeled figure is deterministic)"
    return what
