"""What a finished run is: `RunResult` (the typed record, the one reader and writer of
result.json) and its flat record (one row of a table, its summary line).

  run_result.py  RunResult and its parts; read, write, the summary line, what MLflow logs
  records.py     one flat row per finished run, the rules of a table of them

The package itself is callable: `harness.results(...)` is the tidy frame of finished runs
(harness/report/api.py `results`, docs/python-api.md), as `harness.report(...)` is the report.
Python sets `harness.results` to this package as soon as any of its modules is imported, so
the function has to live on the package; it loads the report's modules only when called
(by name, so that this leaf package imports nothing of the report).
"""

import importlib
import sys
import types
from typing import Any


class _CallableResults(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return importlib.import_module("harness.report.api").results(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableResults
