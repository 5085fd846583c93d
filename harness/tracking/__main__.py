"""`python -m harness.tracking ...`: the command of harness/tracking/tracking.py (see its docstring),
run as `__main__` exactly as `python -m harness.tracking.tracking` runs it."""

import runpy

runpy.run_module("harness.tracking.tracking", run_name="__main__", alter_sys=True)
