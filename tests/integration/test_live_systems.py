"""Live runs of single systems on the tiny proxy: each decodes through the engine and keeps the
gpu_only tokens (lossless), and reports what its system did."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked
from harness.job.live import run_job


# ---- a live run on the tiny proxy ----------------------------------------------------
def test_dali_run_on_the_tiny_proxy_is_lossless(proxy_cache: Path, tmp_path: Path, tiny_dir: Path) -> None:
    cfg = compose_checked(
        ["model=tiny", "system=dali", "decode.gen_length=8", "limit_prompts=2", f"cache_dir={proxy_cache}",
         "tracking.enabled=false"]
    )
    result = run_job(cfg, tmp_path)
    assert result["metrics"]["lossless"] == 1
    assert result["system_report"]["dali_gpu_experts"] + result["system_report"]["dali_cpu_experts"] > 0


# ---- a live run on the tiny proxy ----------------------------------------------------
def test_tide_adaptive_run_on_the_tiny_proxy_is_lossless(proxy_cache: Path, tmp_path: Path, tiny_dir: Path) -> None:
    cfg = compose_checked(
        ["model=tiny", "system=tide_adaptive", "decode.gen_length=8", "limit_prompts=2", f"cache_dir={proxy_cache}",
         "tracking.enabled=false"]
    )
    result = run_job(cfg, tmp_path)
    assert result["metrics"]["lossless"] == 1
    assert result["system_report"]["refreshes"] > 0


# ---- live runs on the tiny proxy ------------------------------------------------------
@pytest.mark.parametrize("system", ["ep_linear", "gem"])
def test_expert_parallel_runs_on_the_tiny_proxy_are_lossless(
    system: str, proxy_cache: Path, tmp_path: Path, tiny_dir: Path
) -> None:
    cfg = compose_checked(
        ["model=tiny", f"system={system}", "topology=multi", "topology.variability=high", "decode.gen_length=8",
         "limit_prompts=2", f"cache_dir={proxy_cache}", "tracking.enabled=false",
         "calibration.prompts=[Sort a list of numbers.]"]  # one prompt: gem's window needs only 16 steps
    )
    result = run_job(cfg, tmp_path)
    assert result["metrics"]["lossless"] == 1 and result["metrics"]["n_gpus"] == 4
    assert result["metrics"]["io_gb"] == 0 and result["metrics"]["cpu_expert_tokens"] == 0
