"""The Hydra command (`python -m harness`, entry point harness/__main__.py): every override
composed and typed before Hydra runs, and the sweep callback.

  overrides.py  composes and types every override (each sweep value) first -> one-line errors
  callbacks.py  Hydra sweep callback: parent run, per-job lines, sweep summary
"""
