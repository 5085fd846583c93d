"""Benchmarking harness for expert offloading in MoE diffusion language models.

The Python API (docs/python-api.md): `harness.run([...])`, `harness.sweep([...])`,
`harness.report(...)`, `harness.results(...)` (the tidy frame; the package harness/results is
callable). They are loaded on first use (PEP 562 module __getattr__) so that
`import harness`, which every command and worker process does, stays cheap.
"""

import importlib
from typing import Any

from harness.common.interrupts import guard_startup

guard_startup()  # a command: Ctrl-C during its imports is one line and exit 130 (not in a notebook)

__version__ = "0.1.0"

_API = {"run": "harness.api", "sweep": "harness.api"}


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    if name in ("report", "results"):  # the callable packages harness/report, harness/results
        return importlib.import_module(f"harness.{name}")
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
