"""The command line and one job (the entry point is harness/__main__.py): the typed config and
the check of every override, a live run or a replay from config to result.json, and the
Hydra sweep callback.

  config.py        HarnessConfig: the typed config, its schemas and cross-part checks
  config_parts.py  the config parts lower modules take (model, workload, trace, tracking)
  cli_check.py     composes and types every override before Hydra runs (one-line errors)
  callbacks.py     Hydra sweep callback: parent run, per-job lines, sweep summary
  run.py           one live run: model -> calibration -> decode under the engine -> result.json
  replay.py        one replay run: trace -> engine -> result.json (no model)
  run_setup.py     what both share: system, budget, cost model; the result from the engine
"""
