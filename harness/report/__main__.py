"""`python -m harness.report ...`: the command of harness/report/report.py (see its docstring),
run as `__main__` exactly as `python -m harness.report.report` runs it."""

import runpy

runpy.run_module("harness.report.report", run_name="__main__", alter_sys=True)
