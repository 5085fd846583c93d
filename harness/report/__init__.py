"""Tables and plots from finished runs: `python -m harness.report`.

  tables.py    the paper-style comparison and a sweep's summary, from run dirs or MLflow
  plots.py     the comparison figures
  __main__.py  `python -m harness.report`: runs tables.py as __main__
"""
