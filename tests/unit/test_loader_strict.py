"""The loader refuses what it would compute wrongly: tensors it has no parameter for, and
config.json features the model does not implement."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.common.errors import HarnessError
from harness.model.checkpoint import from_pretrained
from harness.model.config import IMPLEMENTED_FEATURES, LLaDA2Config
from tests.conftest import REPO


@pytest.fixture
def ckpt(tmp_path, tiny_dir) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, target)
    return target


def _set_config(directory: Path, **values) -> None:
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(values)
    (directory / "config.json").write_text(json.dumps(cfg))


def test_an_unexpected_tensor_is_a_one_line_error(ckpt):
    from safetensors.torch import load_file, save_file

    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(ckpt.glob("model-*.safetensors"))[0]
    tensors = load_file(str(shard))
    name = "model.layers.0.attention.query_key_value.bias"
    tensors[name] = torch.zeros(4)
    save_file(tensors, str(shard))
    index["weight_map"][name] = shard.name
    index_path.write_text(json.dumps(index))
    with pytest.raises(HarnessError, match=f"has tensor {name} that this LLaDA2 implementation does not use") as e:
        from_pretrained(ckpt)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("key", "value"), [("use_qkv_bias", True), ("use_bias", True), ("use_qk_norm", False),
                                            ("hidden_act", "gelu"), ("rope_scaling", {"type": "yarn"}),
                                            ("tie_word_embeddings", True), ("score_function", "softmax")])
def test_an_unimplemented_feature_is_a_one_line_error(ckpt, key, value):
    _set_config(ckpt, **{key: value})
    with pytest.raises(HarnessError, match=f"config.json sets {key}=") as e:
        from_pretrained(ckpt)
    assert "\n" not in str(e.value)


def test_the_published_configs_ask_for_nothing_unimplemented():
    for name in ("llada2_mini", "llada2_flash"):
        raw = json.loads((REPO / "harness" / "model" / "configs"
                          / f"{name}.json").read_text())
        assert all(raw.get(k, v) == v for k, v in IMPLEMENTED_FEATURES.items())
        LLaDA2Config.from_dict(raw)


def test_a_missing_head_dim_takes_the_reference_default():
    raw = json.loads((REPO / "harness" / "model" / "configs"
                      / "llada2_mini.json").read_text())
    raw["head_dim"] = None
    assert LLaDA2Config.from_dict(raw).head_dim == raw["hidden_size"] // raw["num_attention_heads"]


def test_a_single_routed_expert_keeps_its_raw_gate_score_as_the_reference():
    """The reference normalises the routed weights only when top_k > 1; with top_k = 1 the
    weight is the sigmoid score times the scaling factor (normalising would make it 1 x scale)."""
    from harness.model.llada2 import route

    scores = torch.tensor([[0.2, 0.7, 0.1, 0.4]])
    idx, w = route(scores, torch.zeros(4), top_k=1, n_group=1, topk_group=1, scale=2.5)
    assert idx.tolist() == [[1]] and w.tolist() == [[float(torch.tensor(0.7) * 2.5)]]
    idx, w = route(scores, torch.zeros(4), top_k=2, n_group=1, topk_group=1, scale=2.5)
    assert idx.tolist() == [[1, 3]] and w[0].tolist() == pytest.approx([0.7 / 1.1 * 2.5, 0.4 / 1.1 * 2.5])


@pytest.mark.parametrize("key", ["num_experts", "num_experts_per_tok", "vocab_size", "rope_theta",
                                 "first_k_dense_replace", "max_position_embeddings"])
def test_a_missing_key_whose_reference_default_differs_is_refused(key):
    raw = json.loads((REPO / "harness" / "model" / "configs"
                      / "llada2_mini.json").read_text())
    del raw[key]
    with pytest.raises(HarnessError, match=f"config.json has no {key}: the reference") as e:
        LLaDA2Config.from_dict(raw)
    assert "\n" not in str(e.value)


def test_a_missing_key_whose_reference_default_agrees_takes_it():
    raw = json.loads((REPO / "harness" / "model" / "configs"
                      / "llada2_mini.json").read_text())
    for key in ("n_group", "topk_group", "routed_scaling_factor", "partial_rotary_factor"):
        raw.pop(key, None)
    cfg = LLaDA2Config.from_dict(raw)
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor) == (8, 4, 2.5)
