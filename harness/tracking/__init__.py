"""Where results go: MLflow stores, runs and a sweep's parent run, the UI's view of them,
run directories on disk, and what jobs on cluster launchers inherit (docs/tracking.md).

  settings.py      the `tracking` config node (TrackingConfig)
  mlflow_store.py  opening a store, experiments, batched logging, store markers
  mlflow_ui.py     how runs read in the MLflow UI: experiment kind, names, descriptions, datasets
  sweep_run.py     a sweep's parent MLflow run: start, resume, end (KILLED/FAILED if cut short)
  run_files.py     where runs, markers and sweeps live on disk; experiment names
  uris.py          the form of a tracking URI, checked before anything starts
  cluster.py       submitit launchers: what the jobs inherit, SQLite under SLURM
  __main__.py      `python -m harness.tracking push`: an entry point that runs
                   harness/job/mlflow_log.py as __main__ (logging a result needs the job layer)
"""
