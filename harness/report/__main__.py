"""`python -m harness.report ...`: the command of harness/report/tables.py (see its docstring),
run as `__main__` exactly as `python -m harness.report.tables` runs it."""

import runpy

runpy.run_module("harness.report.tables", run_name="__main__", alter_sys=True)
