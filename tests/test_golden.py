"""Golden results: the fixed grid of tests/golden/grid.py gives the figures recorded in
tests/golden/results.json, bit for bit. A refactor must keep them; a deliberate change
of behaviour regenerates the file (`python -m tests.golden.grid`) in its own commit."""

from __future__ import annotations

import json

import pytest

from tests.golden.grid import GOLDEN, canonical, run_grid


@pytest.mark.slow
def test_every_figure_of_the_golden_grid_is_unchanged(tmp_path, proxy_cache, tiny_dir):
    golden = json.loads(GOLDEN.read_text())
    now = canonical(run_grid(proxy_cache, tmp_path))
    assert sorted(now) == sorted(golden)
    changed = [name for name in golden if now[name] != golden[name]]
    detail = []
    for name in changed[:5]:
        was, got = golden[name]["metrics"], now[name]["metrics"]
        keys = sorted(k for k in set(was) | set(got) if was.get(k) != got.get(k))
        detail.append(f"{name}: {[(k, was.get(k), got.get(k)) for k in keys[:6]]}")
    assert not changed, f"{len(changed)} of {len(golden)} cells changed:\n" + "\n".join(detail)
