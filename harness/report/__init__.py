"""Tables and plots from finished runs: `python -m harness.report`.

  report.py    the paper-style comparison and a sweep's summary, from run dirs or MLflow
  plots.py     the comparison figures
  breakdown.py where the modeled time goes: shares per run, per-window plots (gen 256 beside 1024)
  notes.py     routing statistics of replayed traces, tau* curve flatness, decodes stopped at EOS
  __main__.py  `python -m harness.report`: runs report.py as __main__
"""
