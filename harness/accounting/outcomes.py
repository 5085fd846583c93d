"""What placement decided for a batch of forwards (`LayerOutcomes`: the ledger's input), and
a recorder that keeps them to be charged again under other cost tables (docs/sensitivity.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from harness.placement.steps import StepInfo


@dataclass
class LayerOutcomes:
    """m recorded layers of each of n forwards: what placement decided for them.

    on_gpu / missed are subsets of the routed experts (load > 0); every other routed
    expert computes on the CPU. copies_* [n, m]: sync copies that stay resident, one-use
    scratch copies, free moves (charged nothing), async copies (own layer and prefetches).
    wait_row / wait_copies [n, m]: the GPU experts wait until that row's first
    `wait_copies` async copies landed (0: no wait)."""

    loads: np.ndarray  # int64 [n, m, E]
    on_gpu: np.ndarray  # bool [n, m, E]
    missed: np.ndarray  # bool [n, m, E]
    copies_sync: np.ndarray
    copies_scratch: np.ndarray
    copies_async: np.ndarray
    copies_free: np.ndarray | None = None
    wait_row: np.ndarray | None = None
    wait_copies: np.ndarray | None = None
    gpu_s: np.ndarray | None = None  # float [n, m], given (topology=multi)


Batch = tuple[list[StepInfo], list[tuple[int, int]], LayerOutcomes]  # steps, (tokens, context), outcomes


class OutcomeRecorder:
    """Keeps every closed batch of forwards a ledger charges (`Ledger(recorder=...)`), in the
    order charged: copies of the outcomes' masks and counts (a live chunk's arrays are views
    of buffers the ledger reuses), their loads as views of `loads` (every forward's loads,
    kept once: a replay charges its forwards in order)."""

    def __init__(self, loads: np.ndarray) -> None:
        self.loads = loads
        self.batches: list[Batch] = []
        self._first = 0

    def add(self, steps: list[StepInfo], sizes: list[tuple[int, int]], out: LayerOutcomes) -> None:
        n, m = out.loads.shape[:2]
        view = self.loads[self._first : self._first + n, :m]
        if view.shape != out.loads.shape:
            raise RuntimeError("forwards were charged out of order; the recorder cannot share the trace's loads")
        kept = {f.name: _copy(getattr(out, f.name)) for f in fields(LayerOutcomes) if f.name != "loads"}
        self.batches.append((list(steps), list(sizes), LayerOutcomes(loads=view, **kept)))
        self._first += n


def _copy(value: Any) -> Any:
    return np.array(value, copy=True) if isinstance(value, np.ndarray) else value


def join_batches(batches: list[Batch], loads: np.ndarray) -> LayerOutcomes:
    """The recorded batches as one batch of all their forwards (every batch records the same
    layers); its loads the first forwards of `loads`."""
    outs = [b[2] for b in batches]

    def joined(name: str) -> np.ndarray | None:
        values = [getattr(o, name) for o in outs]
        if all(v is None for v in values):
            return None
        if any(v is None for v in values):
            raise ValueError(f"recorded batches disagree on whether they give {name}")
        return np.concatenate(values) if len(values) > 1 else values[0]

    names = [f.name for f in fields(LayerOutcomes) if f.name != "loads"]
    joined_out = {name: joined(name) for name in names}
    n, m = joined_out["on_gpu"].shape[:2] if outs else (0, loads.shape[1])
    return LayerOutcomes(loads=loads[:n, :m], **joined_out)
