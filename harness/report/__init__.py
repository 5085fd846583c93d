"""Tables and plots from finished runs: `python -m harness.report`.

  report.py    the paper-style comparison and a sweep's summary, from run dirs or MLflow
  plots.py     the comparison figures
  __main__.py  `python -m harness.report`: runs report.py as __main__
"""
