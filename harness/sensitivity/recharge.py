"""Re-charging a replay's recorded placement outcomes under another cost model, fast.

The charge rule is the ledger's own (harness/accounting/charge.py): its cost-free part is
prepared once for the whole replay (`prepare_outcomes(reuse=True)`), so that each profile
costs a table lookup per expert, the ordered sums and the compiled clock, and each charge is
added to fresh counters by the ledger's own `add_charge`. All forwards are charged as one
batch, which the ledger's batching never changes, so `modeled_seconds` is the ledger's
`modeled_time_s` to the bit; tests/unit/test_sensitivity.py holds it to full replays.
"""

from __future__ import annotations

import numpy as np

from harness.accounting.charge import Counters, add_charge, charge_prepared, prepare_outcomes
from harness.accounting.cost import CostModel
from harness.accounting.outcomes import Batch, join_batches


class RecordedOutcomes:
    """A replay's recorded outcomes (every charged batch, closed), ready to be charged again."""

    def __init__(self, batches: list[Batch], n_layers: int, overlap: bool, pipeline_slots: int,
                 loads: np.ndarray) -> None:
        """`batches`: (steps, sizes, outcomes) in the order charged (an `OutcomeRecorder`'s);
        `loads`: every forward's loads, of which the batches' are consecutive slices (kept
        once, not copied)."""
        self.n_layers, self.overlap = n_layers, overlap
        out = join_batches(batches, loads)
        if out.gpu_s is not None:
            raise ValueError("outcomes with given GPU seconds (topology=multi) are not re-charged")
        self.sizes = [size for b in batches for size in b[1]]
        self.prepared = prepare_outcomes(out, pipeline_slots, reuse=True)

    def modeled_seconds(self, cost: CostModel) -> float:
        """The ledger's modeled_time_s for these outcomes under `cost`."""
        charged = charge_prepared(self.prepared, cost, self.sizes, self.n_layers, self.overlap)
        counters = Counters()
        add_charge(counters, self.prepared, charged)
        return counters.modeled_time_s
