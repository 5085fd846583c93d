"""Tables and plots from finished runs: `python -m harness.report`, or `harness.report(...)`.

  tables.py    the paper-style comparison, from run dirs or MLflow
  sweep.py     a sweep's summary table (printed at its end, sweep_summary.md/.csv)
  keys.py      what tells runs apart: row keys, system column labels, same-key runs, the cell
               columns every section names its rows by
  frame.py     the tidy frame, one row per run (`harness.results(...)`)
  markdown.py  markdown tables (tabulate)
  uncertainty.py  error bars: 95% CI of the mean over prompts, or their spread
  plots.py     the comparison figures (PNG, PDF, SVG)
  api.py       `harness.report(runs=..., out=...)`: the report as a Python call
  breakdown.py where the modeled time goes: shares per run, per-window plots (gen 256 beside 1024)
  notes.py     routing statistics (recorded, replayed), tau* curve flatness, decodes stopped at EOS
  __main__.py  `python -m harness.report`: runs tables.py's main

The package itself is callable, so that `harness.report(...)` is the report while
`harness.report.plots` and friends stay modules: calling it calls api.report.
"""

from harness.common.callable_package import make_callable

make_callable(__name__, "harness.report.api:report")
