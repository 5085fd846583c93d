"""Re-charging recorded placement outcomes under another cost model, fast.

`Ledger.charge` (harness/accounting/ledger.py) works out, for every batch of forwards, what does
not depend on the cost model (the per-layer tallies, which loads each layer's GPU and CPU
experts have, how those runs group for the ordered sums) and what does (the expert and
non-expert seconds, the clock). `PreparedOutcomes` does the first part once for a whole
replay's outcomes, so that each profile costs a table lookup per expert, the ordered sums
and the compiled clock. It computes every float as `Ledger.charge` does, in the same
order, over all forwards as one batch (which the ledger's own batching never changes), so
`modeled_seconds` is the ledger's `modeled_time_s` to the bit; tests/unit/test_sensitivity.py
holds it to full replays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.accounting.clock import forward_times
from harness.accounting.cost import CostModel
from harness.accounting.ledger import LayerOutcomes
from harness.accounting.ordered_sums import RowSums, constant_row_sums, running_sum
from harness.accounting.pipeline import MissPipeline
from harness.accounting.tallies import layer_tallies


class _Runs:
    """The loads of one set of experts per layer (a bool mask [n, m, E]), in row order, and
    their grouping for the ordered sums."""

    def __init__(self, loads: np.ndarray, mask: np.ndarray, lengths: np.ndarray, top: int) -> None:
        self.shape = lengths.shape
        self.lengths = lengths.ravel()
        # row-major: each row's experts in id order (a load is a token count: int16 where it
        # fits, as memory adds up and a narrow index gathers faster)
        self.picked = np.extract(mask, loads).astype(np.int16 if top < 2**15 else np.int32)
        self._sums: RowSums | None = None
        self._kept: dict[bytes, np.ndarray] = {}  # by the table's values: a profile that changes another part reuses

    def seconds(self, table: np.ndarray, top: int) -> np.ndarray:
        """`table_row_sums(table, loads, mask, lengths, top)`."""
        key = table[: top + 1].tobytes()
        if key not in self._kept:
            if len(self._kept) >= KEPT:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = self._seconds(table, top)
        return self._kept[key]

    def _seconds(self, table: np.ndarray, top: int) -> np.ndarray:
        if top >= 1 and (table[1 : top + 1] == table[1]).all():
            return constant_row_sums(float(table[1]), self.lengths).reshape(self.shape)
        if self._sums is None:  # regrouped once: then each table is one gather and the sums
            self._sums = RowSums(self.lengths)
            self.picked = self._sums.grouped(self.picked)
        return self._sums.grouped_sums(table[self.picked]).reshape(self.shape)


KEPT = 4  # tables whose sums a `_Runs` keeps ([forwards, layers] each: a gen-1024 replay's are 1 MB)


class PreparedOutcomes:
    """A replay's recorded outcomes (every charged batch, closed), ready to be charged again."""

    def __init__(self, batches: Sequence[tuple[list, list[tuple[int, int]], LayerOutcomes]], n_layers: int,
                 overlap: bool, pipeline_slots: int, loads: np.ndarray) -> None:
        """`batches`: (steps, sizes, outcomes) in the order charged; `loads`: every forward's
        loads, of which the batches' are consecutive slices (kept once, not copied)."""
        self.n_layers, self.overlap, self.slots = n_layers, overlap, pipeline_slots
        out = _concatenate([b[2] for b in batches], loads)
        if out.gpu_s is not None:
            raise ValueError("outcomes with given GPU seconds (topology=multi) are not re-charged")
        self.sizes = [size for b in batches for size in b[1]]
        self.out = out
        loads = out.loads
        self.tally = tally = layer_tallies(loads, out.on_gpu, out.missed)
        self.gpu = _Runs(loads, out.on_gpu, tally.n_gpu, tally.top)
        self.cpu = _Runs(loads, (loads > 0) & ~out.on_gpu, tally.n_cpu, tally.top)
        self.hits = _Runs(loads, out.on_gpu & ~out.missed, tally.n_hit, tally.top) if pipeline_slots > 0 else None
        self.to_load = out.on_gpu & out.missed if pipeline_slots > 0 else None
        self.n_sync = out.copies_scratch + out.copies_sync
        if pipeline_slots > 0 and not np.array_equal(tally.n_to_load, self.n_sync):
            raise RuntimeError("a pipelined layer copies other experts than its missed GPU experts")

    def modeled_seconds(self, cost: CostModel) -> float:
        """The ledger's modeled_time_s for these outcomes under `cost`."""
        out, top = self.out, self.tally.top
        gpu_table, cpu_table = cost.time_table("gpu", top), cost.time_table("cpu", top)
        gpu_s, cpu_s = self.gpu.seconds(gpu_table, top), self.cpu.seconds(cpu_table, top)
        breakdowns = {size: cost.non_expert_breakdown(*size) for size in dict.fromkeys(self.sizes)}
        parts = [breakdowns[size] for size in self.sizes]
        split = np.array([(p.before_moe, p.per_moe_layer, p.head) for p in parts], np.float64).reshape(-1, 3)
        copy_one = cost.copy_time(1)
        if cost.pageable:
            blocking = self.n_sync + out.copies_async
            times = forward_times(split, self.n_layers, gpu_s, cpu_s, blocking, np.zeros_like(blocking), copy_one,
                                  self.overlap, cpu_after_copies=True)
        else:
            pipeline = None
            if self.hits is not None and self.to_load is not None:
                pipeline = MissPipeline(self.slots, self.hits.seconds(gpu_table, top), out.loads, self.to_load,
                                        gpu_table)
            times = forward_times(split, self.n_layers, gpu_s, cpu_s, self.n_sync, out.copies_async, copy_one,
                                  self.overlap, out.wait_row, out.wait_copies, pipeline)
        non_expert = running_sum(0.0, np.array([p.total for p in parts]))
        waits = np.concatenate([times.copies_s, times.drain_s[:, None]], 1)
        gpu = running_sum(0.0, gpu_s)
        cpu = running_sum(0.0, times.cpu_exposed_s)
        copies = running_sum(0.0, waits)
        return gpu + cpu + copies + non_expert


def _concatenate(outs: Sequence[LayerOutcomes], loads: np.ndarray) -> LayerOutcomes:
    """One batch of all forwards (every batch records the same layers); its loads the first
    forwards of `loads`."""
    def joined(name: str) -> np.ndarray | None:
        values = [getattr(o, name) for o in outs]
        if all(v is None for v in values):
            return None
        if any(v is None for v in values):
            raise ValueError(f"recorded batches disagree on whether they give {name}")
        return np.concatenate(values) if len(values) > 1 else values[0]

    names = ("on_gpu", "missed", "copies_sync", "copies_scratch", "copies_async", "copies_free", "wait_row",
             "wait_copies", "gpu_s")
    joined_out = {name: joined(name) for name in names}
    n, m = joined_out["on_gpu"].shape[:2] if outs else (0, loads.shape[1])
    return LayerOutcomes(loads=loads[:n, :m], **joined_out)
