"""`python -m harness.tracking ...`: the command of harness/job/mlflow_log.py (see its docstring),
run as `__main__` exactly as `python -m harness.job.mlflow_log` runs it."""

import runpy

runpy.run_module("harness.job.mlflow_log", run_name="__main__", alter_sys=True)
