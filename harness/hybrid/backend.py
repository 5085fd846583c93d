"""`backend=auto|cpu|cuda|standin`: where a live run executes its numerics.

cpu is the single-device emulation (every expert computed in place, timing modeled by
harness/accounting/cost.py); cuda is the real hybrid execution of harness/hybrid/executor.py (timing
measured, the modeled time computed beside it); auto picks cuda when torch sees a GPU.
standin runs the cuda path's executor with the CPU playing the device
(harness/hybrid/device.py's StandInRuntime): slot pools, copies, waits and the CPU worker
all run, so the whole device pipeline (and scripts/gpu_check.sh) can be tried on a machine
without a GPU. Its measured times are CPU times, not GPU ones: it is for checking the
wiring, never for comparing systems.
"""

from __future__ import annotations

import torch

from harness.common.errors import HarnessError

BACKENDS = ("auto", "cpu", "cuda", "standin")
DEVICE_BACKENDS = ("cuda", "standin")  # executed by the hybrid executor, timing measured


def check_backend(name: str) -> None:
    """One-line errors for an unknown backend, or cuda on a machine without one."""
    if name not in BACKENDS:
        raise HarnessError(f"backend={name!r} is not allowed; use one of {', '.join(BACKENDS)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise HarnessError(
            "backend=cuda needs a CUDA GPU, but torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}); use backend=cpu or backend=auto"
        )


def resolve_backend(name: str) -> str:
    """The backend a run uses: 'cpu', 'cuda' or 'standin'."""
    check_backend(name)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name
