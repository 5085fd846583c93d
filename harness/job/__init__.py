"""One job: a run from its whole config (`HarnessConfig`) to result.json, live or replayed,
and what takes the whole config: cached recordings, the backend, resume and MLflow logging.

  config.py        HarnessConfig: the typed config, its schemas and cross-part checks
  live.py          one live run: model -> calibration -> decode under the engine -> result.json
  replay.py        one replay run: trace -> engine -> result.json (no model)
  setup.py         what both share: system, budget, cost model; the result from the engine
  artifacts.py     cached calibration and workload traces and reference tokens; code digests
  execution.py     the backend chosen once (host or device) that every backend step asks
  hybrid_setup.py  loading on CUDA, the per-device reference key, the all-GPU engine
  resume.py        config hashes and the index behind resume=true
  mlflow_log.py    MLflow logging of results and the push command (`python -m harness.tracking push`)
"""
