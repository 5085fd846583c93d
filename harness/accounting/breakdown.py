"""The cost breakdown: where a run's modeled time goes, per forward, per phase and by window length.

The ledger (harness/accounting/ledger.py) keeps one row per charged forward (`COST_COLUMNS`): the
tokens it ran and the context they attended to (the window: prompt + generated so far, or the
cached prefix + the current block), and its modeled seconds split into

    attention_s          attention with its projections and QK norms, every layer
    non_expert_other_s   the rest of the GPU's non-expert work (router, shared expert, dense
                         MLP, norms, lm_head)
    gpu_experts_s        routed experts computed on the GPU
    copies_exposed_s     time the GPU waited for host->GPU copies, and copies still on the link
                         when the forward ended
    cpu_exposed_s        CPU expert time that ran past the GPU path

These five add up to the forward's modeled latency (the clock adds the same terms in its own
order, so to float rounding), and their sums over a run to its `modeled_time_s`, which is
by definition time_non_expert_s + time_gpu_experts_s + time_copies_s + time_cpu_experts_s.
A leaf module: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

COMPONENTS = ("attention_s", "non_expert_other_s", "gpu_experts_s", "copies_exposed_s", "cpu_exposed_s")
COST_COLUMNS = ("tokens", "context", *COMPONENTS)
WINDOW_BIN_TOKENS = 128  # window lengths are grouped in bins of this many tokens


def cost_breakdown(rows: np.ndarray, kinds: Sequence[str]) -> dict[str, Any]:
    """result.json's `cost_breakdown`: the per-forward columns, and the components summed
    over the run and per phase (prefill, denoise, commit)."""
    rows = np.asarray(rows, np.float64).reshape(-1, len(COST_COLUMNS))
    if len(kinds) != len(rows):
        raise ValueError(f"{len(kinds)} step kinds for {len(rows)} cost rows")
    per_step: dict[str, list[Any]] = {"kind": list(kinds)}
    for i, name in enumerate(COST_COLUMNS):
        values = rows[:, i]
        per_step[name] = values.astype(np.int64).tolist() if i < 2 else values.tolist()
    phases = {kind: _sums(rows[np.array([k == kind for k in kinds], bool)]) for kind in dict.fromkeys(kinds)}
    return {"components": list(COMPONENTS), "totals": _sums(rows), "by_phase": phases, "per_step": per_step}


def _sums(rows: np.ndarray) -> dict[str, float]:
    return {name: float(rows[:, 2 + i].sum()) for i, name in enumerate(COMPONENTS)}


def rows_of(section: dict[str, Any]) -> tuple[np.ndarray, list[str]]:
    """The per-forward rows and kinds back from a `cost_breakdown` section."""
    per_step = section["per_step"]
    rows = np.column_stack([np.asarray(per_step[name], np.float64) for name in COST_COLUMNS]) \
        if per_step["kind"] else np.zeros((0, len(COST_COLUMNS)))
    return rows, list(per_step["kind"])


def by_window(section: dict[str, Any], bin_tokens: int = WINDOW_BIN_TOKENS,
              kinds: Sequence[str] = ("denoise",)) -> list[dict[str, Any]]:
    """Mean modeled seconds per forward of each component, by window-length bin
    [lo, lo + bin_tokens), over the forwards of the given phases (denoising steps: the ones
    whose window grows with the generation)."""
    rows, step_kinds = rows_of(section)
    keep = np.array([k in kinds for k in step_kinds], bool)
    rows = rows[keep] if len(rows) else rows
    if not len(rows):
        return []
    bins = (rows[:, 1] // bin_tokens).astype(np.int64)
    out = []
    for b in np.unique(bins):
        members = rows[bins == b]
        means = members[:, 2:].mean(0)
        out.append({"window_lo": int(b * bin_tokens), "window_hi": int((b + 1) * bin_tokens),
                    "forwards": len(members), **{name: float(means[i]) for i, name in enumerate(COMPONENTS)}})
    return out


def shares(section: dict[str, Any]) -> dict[str, float]:
    """Each component's share of the run's modeled time (0..1)."""
    totals = section["totals"]
    whole = sum(totals[name] for name in COMPONENTS)
    return {name: totals[name] / whole if whole > 0 else 0.0 for name in COMPONENTS}
