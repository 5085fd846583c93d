"""Small checks the typed config parts share: a condition that must hold (else a one-line
HarnessError), and whether a schema's mandatory value was given."""

from __future__ import annotations

from typing import Any

from omegaconf import MISSING

from harness.common.errors import HarnessError

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed


def require(ok: bool, message: str) -> None:
    if not ok:
        raise HarnessError(message)


def given(value: Any) -> bool:
    """False for the schema's placeholder of a mandatory value."""
    return value != MISSING
