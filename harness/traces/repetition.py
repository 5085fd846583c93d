"""Greedy decode loops (docs/dali-and-gem.md): how much of each request's generated text
is a short cycle repeated to its end, read from the token ids a recording keeps in its
trace meta (`generated_ids_per_prompt`, written whenever a trace is recorded).

A request's loop: the longest suffix of its generated ids that repeats one cycle of
period p (1 <= p <= MAX_PERIOD) at least MIN_REPEATS times, i.e. ids[i] == ids[i - p] for
every i in the suffix after its first cycle. repetition = the loop's length / the request's
generated tokens (0 when no suffix qualifies). A proxy with random weights that falls into
such a loop routes the same few tokens again and again, which fakes temporal locality at
the loop's period (the DALI replay found a two-token loop over 92% of a GSM8K answer).

  repetition_mean     mean over requests
  repetition_max      the most repetitive request
  looping_requests    share of requests whose loop covers at least half their tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GENERATED_IDS = "generated_ids_per_prompt"  # trace meta: each prompt's generated token ids, prompt order
MAX_PERIOD = 8
MIN_REPEATS = 3
LOOPING = 0.5


def loop_length(ids: Sequence[int], max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS) -> int:
    """Tokens in the longest periodic suffix of `ids` (module docstring); 0 if none."""
    n, best = len(ids), 0
    for p in range(1, max_period + 1):
        i = n - 1
        while i - p >= 0 and ids[i] == ids[i - p]:
            i -= 1
        length = n - 1 - i + p if n >= p else 0  # the matched tail plus its first cycle
        length = min(length, n)
        if length >= p * min_repeats:
            best = max(best, length)
    return best


def repetition_statistics(meta: dict[str, Any]) -> dict[str, float | None]:
    """repetition_mean, repetition_max, looping_requests from a trace's meta (None each
    without recorded ids)."""
    rows = meta.get(GENERATED_IDS)
    if not isinstance(rows, list) or not rows:
        return {"repetition_mean": None, "repetition_max": None, "looping_requests": None}
    shares = [loop_length(list(r)) / len(r) if len(r) else 0.0 for r in rows]
    return {"repetition_mean": sum(shares) / len(shares), "repetition_max": max(shares),
            "looping_requests": sum(s >= LOOPING for s in shares) / len(shares)}
