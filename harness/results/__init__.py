"""What a finished run is: `RunResult` (the typed record, the one reader and writer of
result.json) and its flat record (one row of a table, its summary line).

  run_result.py  RunResult and its parts; read, write, the summary line, what MLflow logs
  records.py     one flat row per finished run, the rules of a table of them

The package itself is callable: `harness.results(...)` is the tidy frame of finished runs
(harness/report/api.py `results`, docs/python-api.md), as `harness.report(...)` is the report.
(harness/common/callable_package.py says why the package itself is callable.)
"""

from harness.common.callable_package import make_callable

make_callable(__name__, "harness.report.api:results")
