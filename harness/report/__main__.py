"""`python -m harness.report ...`: the command of harness/report/tables.py (see its docstring)."""

import sys

from harness.report.tables import main

sys.exit(main())
