"""Golden results: the fixed grid of tests/golden/grid.py gives the figures recorded in
tests/golden/results.json, bit for bit. A refactor must keep them; a deliberate change
of behaviour regenerates the file (`python -m tests.golden.grid`) in its own commit.

One test per system variant (its tiny live and mini replay cells), so that the workers
share the grid and a failure names the variant."""

from __future__ import annotations

import json

import pytest

from tests.golden.grid import GOLDEN, VARIANTS, canonical, cells, run_cell


def test_the_golden_file_holds_every_cell_of_the_grid() -> None:
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(name for name, _ in cells())


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_figure_of_the_golden_grid_is_unchanged(variant: str, tmp_path, proxy_cache, tiny_dir) -> None:
    golden = json.loads(GOLDEN.read_text())
    mine = [(name, overrides) for name, overrides in cells() if name.split("/")[1] == variant]
    assert mine
    now = canonical({name: run_cell(ov, proxy_cache, tmp_path / name.replace("/", "_")) for name, ov in mine})
    changed = [name for name in now if now[name] != golden[name]]
    detail = []
    for name in changed[:5]:
        was, got = golden[name]["metrics"], now[name]["metrics"]
        keys = sorted(k for k in set(was) | set(got) if was.get(k) != got.get(k))
        detail.append(f"{name}: {[(k, was.get(k), got.get(k)) for k in keys[:6]]}")
    assert not changed, f"{len(changed)} of {len(now)} cells changed:\n" + "\n".join(detail)
