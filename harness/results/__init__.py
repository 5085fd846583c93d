"""What a finished run is: `RunResult` (the typed record, the one reader and writer of
result.json) and its flat record (one row of a table, its summary line).

  run_result.py  RunResult and its parts; read, write, the summary line, what MLflow logs
  records.py     one flat row per finished run, the rules of a table of them
"""
