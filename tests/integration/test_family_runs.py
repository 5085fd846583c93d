"""Live runs of the transformers families through the bridge: every family decodes with
transformers' own modeling and generate under the engine and keeps gpu_only's tokens; every
offloading system runs on an autoregressive family; a replay of a family's trace equals its
live run; and bad family input is one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.job.live import run_job

register_configs()
SMALL = ["decode.gen_length=8", "limit_prompts=1", "tracking.enabled=false", "budget=custom"]


def run(overrides: list[str], cache: Path, run_dir: Path):
    return run_job(compose_checked([*SMALL, f"cache_dir={cache}", *overrides]), run_dir)


@pytest.mark.parametrize(("family", "budget"), [("olmoe", "4"), ("mixtral", "24"), ("qwen3_moe", "24"),
                                                ("diffusiongemma", "24")])
def test_every_family_runs_tide_losslessly(family: str, budget: str, proxy_cache: Path, tmp_path: Path) -> None:
    extra = ["decode.steps=4"] if family == "diffusiongemma" else []
    result = run([f"model={family}", "system=tide", f"budget.gpu_gb={budget}", *extra], proxy_cache, tmp_path)
    m = result.flat_metrics()
    assert m["lossless"] == 1 and result.identity.weights == "random-proxy"
    assert 0 < m["experts_per_layer"] < result.budget["derived_experts_per_layer"] + 1
    if family == "diffusiongemma":  # a canvas's denoising steps; encoder forwards are prefill/commit
        assert m["denoise_steps"] > 0 and "decode_steps" not in m
    else:  # one prefill forward, then one decode forward per further token
        assert m["decode_steps"] == m["generated_tokens"] - 1
        assert m["ttft_s"] > 0 and m["tpot_s"] > 0
        assert m["time_prefill_s"] + m["time_decode_s"] == pytest.approx(m["modeled_time_s"])


SYSTEMS = ["fiddler", "mixtral_offload", "tide_adaptive", "oracle", "dali"]


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_offloading_system_is_lossless_on_an_autoregressive_family(system: str, proxy_cache: Path,
                                                                         tmp_path: Path) -> None:
    result = run(["model=olmoe", f"system={system}", "budget.gpu_gb=4"], proxy_cache, tmp_path)
    m = result.flat_metrics()
    assert m["lossless"] == 1 and m["routed_pairs"] > 0


def test_a_family_replay_equals_its_live_run(proxy_cache: Path, tmp_path: Path) -> None:
    live = run(["model=olmoe", "system=fiddler", "budget.gpu_gb=4", "trace.record=true"], proxy_cache,
               tmp_path / "live")
    replay = run(["model=olmoe", "system=fiddler", "budget.gpu_gb=4", "source=trace",
                  f"trace.path={tmp_path / 'live' / 'trace.npz'}"], proxy_cache, tmp_path / "replay")
    for key in ("modeled_time_s", "missed_pairs", "routed_pairs", "io_bytes", "decode_steps", "ttft_s"):
        assert replay.metrics[key] == live.metrics[key], key


@pytest.mark.parametrize(("overrides", "message"), [
    (["model=qwen3_moe", "model.weights=trained"], "model.weights=trained has no recipe"),
    (["model=olmoe", "backend=standin"], "backend=standin executes LLaDA2 (tiny, mini, flash) only"),
    (["model=llama"], "model"),
    (["model=olmoe", "decode.gen_length_bucket=32"],
     "decode.gen_length_bucket=32 trims the decodes of LLaDA2 (tiny, mini, flash)"),
    (["model=mixtral", "model.expert_sum_order=expert_id"],
     "model.expert_sum_order=expert_id applies to LLaDA2 (tiny, mini, flash) only"),
])
def test_bad_family_input_is_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(HarnessError, match=re.escape(message)) as info:
        compose_checked(overrides)
    assert "\n" not in str(info.value)


def test_a_checkpoint_of_another_model_type_names_the_families(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"model_type='llada2_moe'.*allowed: .*mixtral") as info:
        run(["model=olmoe", f"model.path={tiny_dir}", "system=gpu_only"], tmp_path, tmp_path / "run")
    assert "\n" not in str(info.value)
