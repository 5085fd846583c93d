"""The outputs shown in README.md and docs/ are what their commands print today
(scripts/doc_examples.py): a stale figure fails here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def load_checker():
    spec = importlib.util.spec_from_file_location("doc_examples", REPO / "scripts" / "doc_examples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["doc_examples"] = module
    spec.loader.exec_module(module)
    return module


checker = load_checker()


def test_an_example_matches_its_lines_in_order_and_allows_extra_output(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- example: echo hi -->\n```\nline a\nline b\n```\nmore\n")
    [example] = checker.find_examples([page])
    assert example.command == "echo hi" and example.lines == ["line a", "line b"]
    assert checker.mismatch(example, "start\nline a\npath: /tmp/x\nline b\n") is None
    assert checker.mismatch(example, "line b\nline a\n") == "line b"  # out of order
    assert checker.mismatch(example, "line a\nline b changed\n") == "line b"


def test_update_rewrites_only_the_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- example: x -->\n```\nold\n```\nafter\n")
    [example] = checker.find_examples([page])
    checker.update(example, "new 1\nnew 2\n")
    assert page.read_text() == "before\n<!-- example: x -->\n```\nnew 1\nnew 2\n```\nafter\n"


@pytest.mark.slow
def test_every_example_in_the_docs_prints_what_the_docs_show() -> None:
    examples = checker.find_examples(checker.doc_files())
    assert examples, "README.md shows at least one example output"
    for example in examples:
        output = checker.run(example.command)
        assert checker.mismatch(example, output) is None, (
            f"{example.path.name}: `{example.command}` now prints:\n{output}\n"
            "rerun `python scripts/doc_examples.py --update` and commit the new figures with a reason"
        )
