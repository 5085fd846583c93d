"""What a finished run leaves and where it goes: the result record (result.json), its flat row,
run directories, the resume index, and MLflow: stores, runs, a sweep's parent run, the UI,
and what jobs on cluster launchers inherit.

  result.py        RunResult: the typed record of one run, the one reader and writer of result.json
  records.py       one flat row per finished run, its summary line, the rules of a table of them
  run_files.py     where runs, markers and sweeps live on disk; experiment names
  resume.py        config hashes and the index behind resume=true
  tracking.py      MLflow logging of results and the push command (`python -m harness.tracking`)
  mlflow_store.py  opening a store, experiments, batched logging, store markers
  mlflow_ui.py     how runs read in the MLflow UI: experiment kind, names, descriptions, datasets
  sweep_run.py     a sweep's parent MLflow run: start, resume, end (KILLED/FAILED if cut short)
  uris.py          the form of a tracking URI, checked before anything starts
  cluster.py       submitit launchers: what the jobs inherit, SQLite under SLURM
  __main__.py      `python -m harness.tracking`: runs tracking.py as __main__
"""
