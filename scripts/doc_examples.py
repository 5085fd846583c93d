"""Example outputs in README.md and docs/ that a command produced, checked (or rewritten)
by running the command again, so that no figure shown in the docs can go stale.

An example is an HTML comment naming the command, followed by a fenced block of what it
printed:

    <!-- example: python -m harness ... tracking.enabled=false -->
    ```
    [tide] model=mini ... | modeled 19.3 tokens/s (trace) | miss 62.0% ...
    ```

`python scripts/doc_examples.py` runs every example's command from the repository root and
requires each line of its block to appear in the command's standard output, in order (a
command may print more: paths and links that differ per run); `--update` rewrites the
blocks with the output instead. tests/integration/test_doc_examples.py runs the check.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- example: (?P<command>.+?) -->\n```[a-z]*\n(?P<block>.*?)```", re.S)


@dataclass
class Example:
    path: Path
    command: str
    block: str
    span: tuple[int, int]  # of the block's text in the file

    @property
    def lines(self) -> list[str]:
        return [line for line in self.block.splitlines() if line.strip()]


def find_examples(paths: list[Path]) -> list[Example]:
    found = []
    for path in paths:
        text = path.read_text()
        for match in MARKER.finditer(text):
            found.append(Example(path, match["command"], match["block"], match.span("block")))
    return found


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def run(command: str, env: dict[str, str] | None = None) -> str:
    """The command's standard output (it runs from the repository root)."""
    done = subprocess.run(shlex.split(command), cwd=REPO, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{command}` exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def mismatch(example: Example, output: str) -> str | None:
    """None when every line of the example appears in `output` in order, else the first
    line that does not."""
    printed = [line.rstrip() for line in output.splitlines()]
    at = 0
    for line in example.lines:
        while at < len(printed) and printed[at] != line.rstrip():
            at += 1
        if at == len(printed):
            return line
        at += 1
    return None


def update(example: Example, output: str) -> None:
    text = example.path.read_text()
    start, end = example.span
    example.path.write_text(text[:start] + output.rstrip("\n") + "\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite each example's block with its output")
    args = parser.parse_args(argv)
    failed = 0
    # rewrite from the last example of a file up, so earlier spans stay valid
    for example in reversed(find_examples(doc_files())):
        output = run(example.command)
        if args.update:
            update(example, output)
            continue
        wrong = mismatch(example, output)
        if wrong is not None:
            failed += 1
            print(f"{example.path.relative_to(REPO)}: `{example.command}` no longer prints:\n  {wrong}\n"
                  f"it printed:\n  " + "\n  ".join(output.splitlines()), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
