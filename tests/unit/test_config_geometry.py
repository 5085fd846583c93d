"""Any MoE model's geometry from its config.json (harness/families/config_geometry.py): the
four published configs come out within 2% of their published parameter totals, every count
adds up to the model transformers builds, dense/interleaved/shared layouts are found where
they are, and a config that is not a known MoE model is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.common.errors import HarnessError
from harness.families.config_geometry import (
    config_geometry,
    geometry_of_config,
    hf_config_of,
    published_geometry,
    published_names,
    read_published,
)
from tests.routing_files import TINY_DEEPSEEK, write_config

PUBLISHED = ["deepseek_v3", "gpt_oss_120b", "llama4_scout", "qwen3_235b_a22b"]


def test_the_four_published_configs_are_stored_with_their_source() -> None:
    assert published_names() == PUBLISHED
    for name in PUBLISHED:
        source = read_published(name)["_source"]
        assert {"hf_repo", "config_url", "read_from", "published_params"} <= set(source)
        assert {"total", "active", "source"} <= set(source["published_params"])


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_totals_are_within_2_percent(name: str) -> None:
    g = published_geometry(name)
    published = read_published(name)["_source"]["published_params"]
    assert abs(g.total_params / published["total"] - 1) < 0.02, (name, g.total_params)


def test_published_active_counts_where_the_definitions_agree() -> None:
    """Qwen3 and Llama 4 count both embeddings as active; gpt-oss's card counts the
    unembedding only (its 5.1B); DeepSeek's README says 36.7B (ours 37.55B, 2.3% more:
    not asserted, docs/real-routing.md)."""
    for name in ("qwen3_235b_a22b", "llama4_scout"):
        g, active = published_geometry(name), read_published(name)["_source"]["published_params"]["active"]
        assert abs(g.active_params / active - 1) < 0.02, name
    g = published_geometry("gpt_oss_120b")
    assert abs((g.active_params - g.vocab_size * g.hidden_size) / 5.1e9 - 1) < 0.02


@pytest.mark.parametrize("name", ["gpt_oss_120b", "llama4_scout", "qwen3_235b_a22b"])
def test_every_parameter_has_its_place(name: str) -> None:
    """The model transformers builds is accounted for by the geometry's parts with nothing
    left over but the final norm (extra_params holds whatever no part claims)."""
    from transformers import AutoModelForCausalLM

    hf, _ = hf_config_of(read_published(name)["config"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf.get_text_config(decoder=True))
    g = published_geometry(name)
    assert g.extra_params == g.hidden_size  # the final RMSNorm, nothing unclaimed
    assert min(g.attention_params_total, g.router_params, g.layer_norm_params, g.expert_params) > 0
    assert g.total_params == sum(p.numel() for p in model.parameters())


def test_the_layouts_come_out_as_the_models_have_them() -> None:
    ds = published_geometry("deepseek_v3")
    assert ds.extra_params == ds.hidden_size and ds.dense_mlp_params == 3 * 7168 * 18432
    assert ds.sparse_layers == tuple(range(3, 61)) and ds.first_k_dense_replace == 3
    assert (ds.num_experts, ds.num_experts_per_tok, ds.num_shared_experts) == (256, 8, 1)
    assert ds.expert_params == 3 * 7168 * 2048 and ds.intermediate_size == 18432
    assert (ds.num_key_value_heads, ds.head_dim) == (1, (512 + 64) // 2)  # MLA's latent, charged as one KV head
    assert (ds.dtype, ds.quantization) == ("bfloat16", "fp8")
    oss = published_geometry("gpt_oss_120b")
    assert oss.expert_params == 3 * 2880 * 2880 + 2 * 2880 + 2880  # gate_up and down biases included
    assert (oss.n_moe_layers, oss.num_experts_per_tok, oss.quantization) == (36, 4, "mxfp4")
    scout = published_geometry("llama4_scout")
    assert scout.sparse_layers == tuple(range(48)) and scout.num_shared_experts == 1
    assert scout.dropped_keys == ("attn_temperature_tuning",)  # published as 4, transformers wants a bool
    qwen = published_geometry("qwen3_235b_a22b")
    assert (qwen.n_moe_layers, qwen.num_shared_experts, qwen.num_key_value_heads) == (94, 0, 4)


def test_interleaved_and_first_k_dense_layers(tmp_path: Path) -> None:
    interleaved = {"model_type": "llama4_text", "hidden_size": 32, "intermediate_size": 16,
                   "intermediate_size_mlp": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 8, "num_local_experts": 8, "num_experts_per_tok": 1,
                   "interleave_moe_layer_step": 2, "vocab_size": 64}
    g = geometry_of_config("interleaved", interleaved)
    assert g.sparse_layers == (1, 3) and g.dense_mlp_params == 3 * 32 * 48 and g.intermediate_size == 48
    qwen = {"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 40, "moe_intermediate_size": 8,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0, 2], "vocab_size": 64}
    assert geometry_of_config("qwen", qwen).sparse_layers == (1, 3)
    tiny = config_geometry(write_config(tmp_path))
    assert tiny.sparse_layers == (1, 2, 3) and tiny.num_experts == 16 and tiny.num_shared_experts == 1
    assert config_geometry(tmp_path) is tiny  # the directory reads the same file; cached by its bytes


def test_what_is_not_a_known_moe_model_is_one_line(tmp_path: Path) -> None:
    dense = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 64}
    cases = [
        (dense, r"describes a dense model \(model_type=llama: no num_experts"),
        ({**TINY_DEEPSEEK, "model_type": "no_such_moe"}, r"transformers \S+ does not know model_type='no_such_moe'"),
    ]
    for i, (raw, message) in enumerate(cases):
        path = tmp_path / str(i) / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(raw))
        with pytest.raises(HarnessError, match=message) as info:
            config_geometry(path)
        assert "\n" not in str(info.value)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(HarnessError, match=r"bad\.json is not a JSON config"):
        config_geometry(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(HarnessError, match=r"list\.json is not a Hugging Face model config"):
        config_geometry(tmp_path / "list.json")
    with pytest.raises(HarnessError, match=r"no config\.json at .*missing"):
        config_geometry(tmp_path / "missing")
