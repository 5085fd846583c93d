"""How well each next-layer predictor of a recording names layer l+1's experts: DALI's
prefetch measures (harness/traces/dali_measures.py) for the residual and next_gate hint
channels and the token-count history, per trace and phase (docs/dali-and-gem.md).

    PYTHONPATH=. python scripts/hint_accuracy.py <trace.npz> [<trace.npz> ...]
"""

from __future__ import annotations

import sys
import time

from harness.placement.trace import RoutingTrace
from harness.traces.dali_measures import measures_of_trace

PREDICTORS = ("residual", "next_gate", "token_count")


def _cell(measures: dict[str, float], name: str) -> str:
    value = measures.get(f"prefetch_{name}")
    return "-" if value is None else f"{value:.3f}"


def main(paths: list[str]) -> None:
    start = time.process_time()
    print("| trace | forwards | phase | " + " | ".join(f"precision {p}" for p in PREDICTORS) + " | "
          + " | ".join(f"recall {p}" for p in PREDICTORS) + " |")
    print("|---" * (3 + 2 * len(PREDICTORS)) + "|")
    for path in paths:
        trace = RoutingTrace.load(path)
        m = measures_of_trace(trace, capacity=1, top_k=int(trace.geometry["num_experts_per_tok"]))
        for phase in ("", *sorted({s.kind for s in trace.steps})):
            suffix = f"_{phase}" if phase else ""
            print(f"| {path} | {len(trace)} | {phase or 'all'} | "
                  + " | ".join(_cell(m, f"precision_{p}{suffix}") for p in PREDICTORS) + " | "
                  + " | ".join(_cell(m, f"recall_{p}{suffix}") for p in PREDICTORS) + " |")
    print(f"cpu_s {time.process_time() - start:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
