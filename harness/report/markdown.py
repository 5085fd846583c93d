"""The report's markdown tables, written by tabulate (pipe tables, as GitHub renders them):
cells are given as the text they show, so tabulate neither parses nor reformats them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabulate import tabulate


def pipe_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table, ending with a newline."""
    def text(value: Any) -> str:
        return str(value).replace("|", "\\|")  # a | inside a cell would end it

    return tabulate([[text(c) for c in r] for r in rows], headers=[text(h) for h in headers], tablefmt="pipe",
                    disable_numparse=True, stralign="left") + "\n"
