"""The typed config at the edge: compose -> HarnessConfig (every part its dataclass), the
one-line errors of the dataclasses' checks, and the top-level `block` key."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from harness.accounting.budget import BudgetConfig
from harness.accounting.cost import HardwareConfig
from harness.accounting.topology import TopologyConfig
from harness.cli.overrides import compose_checked, compose_raw, override_variants, precheck
from harness.common.errors import HarnessError
from harness.decode.decoding import DecodeSettings
from harness.job.config import HarnessConfig, ModelConfig, ServedWorkloadConfig, register_configs
from harness.job.mlflow_log import TrackingConfig
from systems.registry import SYSTEM_CONFIGS

register_configs()


def test_the_composed_config_is_typed_all_the_way_down() -> None:
    cfg = compose_checked(["model=tiny", "system=mixtral_offload", "system.prefetch=true"])
    assert isinstance(cfg, HarnessConfig)
    parts = {"model": ModelConfig, "decode": DecodeSettings, "workload": ServedWorkloadConfig, "budget": BudgetConfig,
             "hardware": HardwareConfig, "topology": TopologyConfig, "tracking": TrackingConfig}
    assert {k: type(getattr(cfg, k)) for k in parts} == parts
    assert type(cfg.system) is SYSTEM_CONFIGS["mixtral_offload"] and cfg.system.prefetch is True


@pytest.mark.parametrize("name", sorted(SYSTEM_CONFIGS))
def test_every_system_option_gives_its_own_dataclass(name: str) -> None:
    """`system=<name>`: the node registered from its entry (or a YAML of the same name)."""
    topology = ["topology=multi"] if name in ("ep_linear", "gem") else []
    cfg = compose_checked([f"system={name}", *topology])
    assert type(cfg.system) is SYSTEM_CONFIGS[name] and cfg.system.name == name


def test_system_options_take_their_schema_types() -> None:
    assert compose_checked(["system.tau=3"]).system.tau == "3"  # TideConfig.tau is a string (auto|random|n)
    with pytest.raises(HarnessError, match="prefetch"):
        compose_checked(["system=mixtral_offload", "system.prefetch=maybe"])
    with pytest.raises(HarnessError, match="rate"):
        compose_checked(["system.rate=1"])


def test_as_dict_is_the_resolved_config_hydra_composed() -> None:
    """result.json's "config" and the resume hash keep their meaning: the same plain data
    OmegaConf.to_container(cfg, resolve=True) gave before the typed config."""
    for overrides in (["model=tiny", "block=64"], ["system=gem", "topology=multi", "budget=18GB"],
                      ["+experiment=tau_sweep", "system.tau=4"]):
        raw = OmegaConf.to_container(compose_raw(overrides), resolve=True)
        assert compose_checked(overrides).as_dict() == raw


BAD_VALUES = [
    (["decode.gen_length=0"], "decode.gen_length=0 must be a positive number of tokens"),
    (["decode.block_length=-4"], "decode.block_length=-4 must be positive (32 or 64 in the paper)"),
    (["decode.steps=64"], "decode.steps=64 cannot serve decode.block_length=32: steps per block must be "
                          "between 1 and block_length"),
    (["block=8", "decode.steps=9"], "decode.steps=9 cannot serve decode.block_length=8"),
    (["decode.threshold=1.5"], "decode.threshold=1.5 must be in (0, 1]"),
    (["decode.temperature=-1"], "decode.temperature=-1.0 must be >= 0 (0 = argmax)"),
    (["decode.cache=maybe"], "decode.cache='maybe' is not allowed; use prefix or none"),
    (["model.dtype=fp8"], "model.dtype='fp8' is not allowed; use one of float32, bfloat16"),
    (["model.expert_sum_order=sorted"], "model.expert_sum_order='sorted' is not allowed; use one of router, expert_id"),
    (["decode.gen_length_bucket=64"], "decode.gen_length_bucket=64 exceeds decode.gen_length=32"),
    (["model.name=huge"], "model.name='huge' is not allowed; use one of tiny, mini, flash"),
    (["source=disk"], "source='disk' is not allowed; use live or trace"),
    (["limit_prompts=0"], "limit_prompts=0 must be positive or null"),
    (["backend=tpu"], "backend='tpu' is not allowed; use one of auto, cpu, cuda, standin"),
    (["workload=jsonl"], "workload=jsonl has no prompts: set workload.path=<file.jsonl>"),
    (["budget.gpu_gb=0"], "budget.gpu_gb must be a finite number of GB in (0, 1e+06] (got 0.0)"),
    (["budget.experts_per_layer=8", "budget.max_experts_per_layer=4"],
     "budget.experts_per_layer=8 exceeds budget.max_experts_per_layer=4"),
    (["hardware.pcie_gbps=0"], "hardware.pcie_gbps must be a finite number > 0 (got 0.0); fix conf/hardware"),
    (["topology.n_gpus=2"], "topology=single has one GPU (got topology.n_gpus=2)"),
    (["topology=multi", "topology.variability=wild"], "topology.variability='wild' is not allowed"),
    (["system=ep_linear"], "system=ep_linear maps experts over several GPUs; add topology=multi"),
    (["system=dali", "topology=multi"], "system=dali runs on one GPU; use topology=single"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_VALUES, ids=[" ".join(o) for o, _ in BAD_VALUES])
def test_a_bad_value_is_the_one_line_error_of_its_check(overrides: list[str], message: str) -> None:
    with pytest.raises(HarnessError) as err:
        compose_checked(["model=tiny", *overrides])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_checks_run_when_a_part_is_built_in_code_too() -> None:
    with pytest.raises(HarnessError, match=r"decode\.steps=0 cannot serve"):
        DecodeSettings(steps=0)
    with pytest.raises(HarnessError, match=r"model\.name='huge'"):
        ModelConfig(name="huge", nominal="proxy")
    ModelConfig()  # the schema's own placeholder (MISSING) is not checked


def test_block_is_a_plain_key_that_block_length_and_steps_follow() -> None:
    assert (compose_checked([]).decode.block_length, compose_checked([]).decode.steps) == (32, 32)
    cfg = compose_checked(["block=64"])  # no quoting of argv: `block` is an int key, not a group
    assert (cfg.block, cfg.decode.block_length, cfg.decode.steps) == (64, 64, 64)
    own = compose_checked(["block=64", "decode.steps=16"])
    assert (own.decode.block_length, own.decode.steps) == (64, 16)
    assert compose_checked(["decode=paper", "block=64"]).decode.block_length == 64


def test_a_block_sweep_composes_each_value() -> None:
    variants = override_variants(["model=tiny", "block=32,64"])
    assert variants == [["model=tiny", "block=32"], ["model=tiny", "block=64"]]
    assert [compose_checked(v).decode.block_length for v in variants] == [32, 64]
    precheck(["-m", "model=tiny", "block=32,64"])  # what `python -m harness -m block=32,64` checks first
    with pytest.raises(HarnessError, match="block"):
        precheck(["-m", "block=32,big"])
