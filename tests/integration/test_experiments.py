"""Every experiment config composes, and a reduced version of each runs end to end."""

from __future__ import annotations

import json
import os
import sys

import pytest

from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from systems.tide import Tide
from tests import process_wait
from tests.conftest import REPO

register_configs()
EXPERIMENTS = ("table1", "table1_greedy", "table1_flash", "tau_ablation", "tau_sweep", "diffusiongemma", "ar_offload")
MODEL_OF = {"table1_flash": "flash", "diffusiongemma": "diffusiongemma", "ar_offload": "qwen3_moe"}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_as_a_replay_grid(name):
    cfg = compose_checked([f"+experiment={name}"])
    assert cfg.source == "trace" and cfg.system.name == "tide"
    assert cfg.model.name == MODEL_OF.get(name, "mini")


PAPER_DECODE = ("table1", "table1_greedy", "table1_flash", "tau_ablation")


@pytest.mark.parametrize("name", PAPER_DECODE)
def test_the_paper_experiments_decode_as_the_reference_evaluation(name):
    """The paper's decode (docs/traces-and-experiments.md): sampled at temperature 1 with
    eval_dinfer.py's seed, gen_length trimmed to multiples of 32, bf16; table1_greedy is the
    same grid taken by argmax."""
    cfg = compose_checked([f"+experiment={name}"])
    assert cfg.decode.temperature == (0.0 if name.endswith("greedy") else 1.0)
    assert (cfg.decode.seed, cfg.decode.gen_length_bucket, cfg.model.dtype) == (1234, 32, "bfloat16")
    assert cfg.calibration.from_workload == 4 and cfg.decode.cache == "none"


REDUCED = {
    "table1": ["decode.gen_length=16", "decode.gen_length_bucket=8", "budget=10GB", "system=gpu_only,tide"],
    "tau_ablation": ["decode.gen_length=8", "decode.gen_length_bucket=8", "block=32", "budget=10GB",
                     "system.tau=1,random"],
    "tau_sweep": ["system.tau=2,auto"],
    # the transformers families: the smallest AR family stands in for the experiment's two
    "ar_offload": ["model=olmoe", "budget.gpu_gb=4", "system=gpu_only,tide,dali"],
    # diffusiongemma is not run here (80 s under load): its config composes above, its family runs
    # live in test_family_runs.py and a family's trace replay is ar_offload's run below
    "dali": ["model=olmoe", "budget.gpu_gb=4", "system=static_split,dali_no_prefetch"],
    "gem": ["model=olmoe", "workload.batch=2", "topology.n_gpus=4", "topology.variability=high",
            "system=ep_linear,gem"],
    # block-diffusion requests served in lock-step on the tiny LLaDA2 proxy
    "gem_llada2": ["limit_prompts=2", "workload.batch=2", "topology.n_gpus=4", "topology.variability=high",
                   "system=ep_linear,gem"],
}
BASE = {"ar_offload": [], "dali": [], "gem": []}  # model=tiny does not apply to a family


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REDUCED))
def test_reduced_experiment_runs(name, proxy_cache, tmp_path, tiny_dir):
    sweep = tmp_path / "sweep"
    reduced = {o.split("=", 1)[0] for o in REDUCED[name]}  # a key is given once: the experiment's value wins
    common = [o for o in ("limit_prompts=1", "decode.gen_length=8", "block=32") if o.split("=", 1)[0] not in reduced]
    cmd = [sys.executable, "-m", "harness", "-m", f"+experiment={name}", *BASE.get(name, ["model=tiny"]),
           *common, "tracking.enabled=false", f"hydra.sweep.dir={sweep}", *REDUCED[name]]
    env = {**os.environ, "HARNESS_CACHE": str(proxy_cache)}
    proc = process_wait.run(cmd, f"+experiment={name}", cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = [json.loads(p.read_text()) for p in sweep.glob("*/result.json")]
    expected = 1
    for arg in REDUCED[name]:
        expected *= len(arg.split("=", 1)[1].split(","))
    assert len(results) == expected
    assert all(r["source"] == "trace" for r in results)
    if name == "dali":  # every job reports DALI's measures, prefill and decode apart
        assert all({"cpu_side_share_decode", "cache_hit_rate_lru_prefill"} <= set(r["metrics"]) for r in results)
    if name in ("gem", "gem_llada2"):  # served in lock-step: per-request percentiles; gem also its profiling cost
        assert all({"tpot_p90_s", "e2e_latency_mean_s", "serving_batches"} <= set(r["metrics"]) for r in results)
        assert [("gem_profile_samples" in r["metrics"]) for r in sorted(results, key=lambda r: r["config"]["system"]
                ["name"])] == [False, True]


def test_the_dali_experiment_runs_dali_and_each_part_switched_off():
    from omegaconf import OmegaConf

    sweep = OmegaConf.load(REPO / "conf" / "experiment" / "dali.yaml").hydra.sweeper.params
    assert sweep.system.split(",") == ["static_split", "fiddler", "mixtral_offload", "dali", "dali_no_assign",
                                       "dali_no_prefetch", "dali_no_replacement"]
    cfg = compose_checked(["+experiment=dali"])
    assert (cfg.source, cfg.model.name, cfg.hardware.name, cfg.measures) == ("trace", "qwen3_moe", "rtx4090_pcie4",
                                                                             True)
    for part in ("assign", "prefetch", "replacement"):
        system = compose_checked(["+experiment=dali", f"system=dali_no_{part}"]).system
        off = {k for k in ("assign", "prefetch", "replacement") if getattr(system, k) is False}
        assert (system.name, off) == ("dali", {part})


@pytest.mark.parametrize("name", ["dali", "gem"])
def test_the_dali_and_gem_experiments_pin_proxies_that_do_not_loop(name):
    """Their proxies are seeded so that greedy decodes do not loop (docs/dali-and-gem.md#greedy-decode-loops);
    a command-line seed still wins."""
    for model in ("qwen3_moe", "mixtral"):
        assert compose_checked([f"+experiment={name}", f"model={model}"]).model.proxy_seed == 6
    assert compose_checked([f"+experiment={name}", "model.proxy_seed=0"]).model.proxy_seed == 0


def test_random_tau_is_seeded_and_within_range():
    def taus(seed: int) -> list[int]:
        from harness.placement.steps import StepInfo

        t = Tide(tau="random", seed=seed, steps_per_block=8)
        t.prepare(type("Ctx", (), {"experts_per_layer": 4, "calibration": None, "cost": None,
                                   "decode_steps": 8})())
        for block in range(20):
            t.on_step(StepInfo(0, block, 0, block, block == 0, "denoise"))
        return t.report()["tau_per_block"]

    assert taus(1) == taus(1) and taus(1) != taus(2)
    assert all(1 <= tau <= 8 for tau in taus(3)) and len(set(taus(3))) > 2


def test_random_tau_needs_steps():
    t = Tide(tau="random")
    with pytest.raises(HarnessError, match="steps_per_block"):
        t.prepare(type("Ctx", (), {"experts_per_layer": 4, "calibration": None, "cost": None,
                                   "decode_steps": None})())


@pytest.mark.parametrize("name", ["table1", "table1_flash"])
def test_table1_runs_tide_overlapped_and_sequential(name):
    from omegaconf import OmegaConf

    sweep = OmegaConf.load(REPO / "conf" / "experiment" / f"{name}.yaml").hydra.sweeper.params
    assert {"tide", "tide_sequential"} <= set(sweep.system.split(","))
    overlapped = compose_checked([f"+experiment={name}", "system=tide"]).system
    sequential = compose_checked([f"+experiment={name}", "system=tide_sequential"]).system
    assert (overlapped.name, overlapped.overlap) == ("tide", True)
    assert (sequential.name, sequential.overlap) == ("tide", False)
