"""The MLflow UI in a real browser: scripts/ui_check.sh (a tiny sweep, `mlflow ui`, headless
Chromium). Skipped where Chromium is not installed (apt-get install -y chromium)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests import process_wait
from tests.harness_cli import REPO, harness_env

CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"),
                             shutil.which("google-chrome")) if p), None)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get update && apt-get install -y "
                                              "chromium); the MLflow UI check needs a real browser")
def test_mlflow_ui_shows_the_sweep_in_a_real_browser(tmp_path: Path, proxy_cache: Path) -> None:
    env = {**harness_env(proxy_cache), "CHROMIUM": str(CHROMIUM)}
    proc = process_wait.run(["bash", str(REPO / "scripts" / "ui_check.sh"), str(tmp_path / "shots")],
                            "scripts/ui_check.sh", cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert not [ln for ln in lines if ln.startswith("FAILED")]
    assert sum(ln.startswith("ok:") for ln in lines) == 13, proc.stdout
    shots = {p.name for p in (tmp_path / "shots").glob("*.png")}
    assert {"02-runs-table.png", "04-chart-view.png", "05-parent-run.png"} <= shots
    assert "stopped" in proc.stdout  # the server was stopped by its pid
