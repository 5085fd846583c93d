"""`python -m harness.report ...`: the command of harness/report/report.py (see its docstring)."""

import sys

from harness.report.report import main

sys.exit(main())
