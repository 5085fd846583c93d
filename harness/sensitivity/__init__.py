"""Sensitivity and rank flips: every cell of a replay sweep replayed with each hardware
constant scaled (`python -m harness.sensitivity sweep=<dir>`, docs/sensitivity.md).

    scaling.py    the constants and the scale grid
    analysis.py   winner, margin, the smallest change that flips either (bisection)
    replayer.py   one job's tokens/s under any profile (full replay, or a re-charge)
    sweep.py      a sweep's jobs and cells
    cells.py      one cell analysed
    output.py     markdown, CSV, tornado plots; mlflow_log.py: under the sweep's parent run
"""
