"""The one exception type the harness raises for bad input.

`python -m harness` turns a `HarnessError` into a single line on stderr and exit code 2,
so every message must name the problem and the fix on its own.
"""


class HarnessError(Exception):
    """Bad input or a broken artifact (config, checkpoint, prompts file, trace)."""
