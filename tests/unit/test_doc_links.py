"""Every relative link in README.md and docs/ points at a file or folder of the repository."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """'page -> target' for each relative link of `page` to a path that does not exist."""
    bad = []
    for target, _ in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            bad.append(f"{page.relative_to(root)} -> {target}")
    return bad


def test_the_link_finder_flags_a_missing_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "here.md").write_text("x")
    page.write_text("[a](here.md) [b](gone.md#part) [c](https://example.org) [d](#anchor)")
    assert broken_links(page, tmp_path) == ["page.md -> gone.md"]


def test_every_page_the_docs_link_exists() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    bad = [line for page in pages for line in broken_links(page)]
    assert not bad, "broken links:\n" + "\n".join(bad)


TEST_FILE = re.compile(r"\btests/[\w/]+\.py\b")


def missing_test_files(script: str, root: Path = REPO) -> list[str]:
    """The test files a script names that do not exist (pytest on a moved file runs no test)."""
    return [path for path in TEST_FILE.findall(script) if not (root / path).is_file()]


def test_the_test_file_finder_flags_a_moved_file(tmp_path: Path) -> None:
    (tmp_path / "tests" / "integration").mkdir(parents=True)
    (tmp_path / "tests" / "integration" / "test_a.py").write_text("")
    script = "pytest tests/integration/test_a.py -m cuda\npytest tests/unit/test_a.py\n"
    assert missing_test_files(script, tmp_path) == ["tests/unit/test_a.py"]


def test_every_test_file_the_scripts_run_exists() -> None:
    bad = [f"{s.name}: {p}" for s in sorted((REPO / "scripts").glob("*.sh")) for p in missing_test_files(s.read_text())]
    assert not bad, "scripts run test files that do not exist:\n" + "\n".join(bad)
