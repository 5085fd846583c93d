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
