"""The model, checkpoint loading and proxy checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.common.errors import HarnessError
from harness.model.checkpoint import from_pretrained
from harness.model.config import LLaDA2Config
from harness.model.experts import compute_routed_experts
from harness.model.llada2 import MoE, block_causal_mask
from harness.model.proxy import proxy_config, proxy_is_complete
from harness.training.proxy_cache import ensure_proxy
from tests.conftest import REPO

SHARED_REFERENCE = REPO.parent / "shared" / "reference"


@pytest.mark.parametrize(
    ("name", "total", "active"), [("llada2_mini", 16.3e9, 1.43e9), ("llada2_flash", 102.9e9, 6.15e9)]
)
def test_published_configs_give_design_parameter_counts(name, total, active):
    cfg = LLaDA2Config.published(name)
    assert abs(cfg.total_params - total) / total < 0.01
    assert abs(cfg.active_params - active) / active < 0.01
    assert cfg.n_moe_layers == cfg.num_hidden_layers - 1


@pytest.mark.skipif(not SHARED_REFERENCE.exists(), reason="../shared/reference not present")
def test_shared_reference_configs_parse_like_the_packaged_copies():
    for path in sorted(SHARED_REFERENCE.glob("*.json")):
        cfg = LLaDA2Config.from_json(path)
        packaged = LLaDA2Config.published(path.stem.replace("_config", ""))
        assert cfg == packaged


def test_expert_and_non_expert_bytes_match_design():
    mini, flash = LLaDA2Config.published("llada2_mini"), LLaDA2Config.published("llada2_flash")
    assert mini.expert_bytes() == pytest.approx(6.29e6, rel=0.01)
    assert flash.expert_bytes() == pytest.approx(25.17e6, rel=0.01)
    assert mini.non_expert_bytes() == pytest.approx(1.91e9, rel=0.01)
    assert flash.non_expert_bytes() == pytest.approx(6.06e9, rel=0.01)


def naive_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Independent per-token reference: loops over tokens and their top-k experts."""
    gate = moe.gate
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        s = torch.sigmoid(x[t].float() @ gate.weight.float().T)
        r = s + gate.expert_bias.float()
        groups = r.view(gate.n_group, -1)
        group_score = groups.topk(2).values.sum(-1)
        keep = set(group_score.topk(gate.topk_group).indices.tolist())
        per_group = r.numel() // gate.n_group
        allowed = [e for e in range(r.numel()) if e // per_group in keep]
        chosen = sorted(allowed, key=lambda e: -float(r[e]))[: gate.top_k]
        total = sum(float(s[e]) for e in chosen)
        for e in chosen:
            ex = moe.experts[e]
            y = F.linear(F.silu(F.linear(x[t], ex.gate)) * F.linear(x[t], ex.up), ex.down)
            out[t] += float(s[e]) / total * gate.scale * y
        out[t] += moe.shared_experts(x[t : t + 1])[0]
    return out


def test_moe_layer_matches_naive_per_token_reference(tiny_model):
    moe = tiny_model.moe_layers()[0]
    x = torch.randn(12, tiny_model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    got = moe(x, tiny_model.engine, None)
    torch.testing.assert_close(got, naive_moe(moe, x), rtol=1e-4, atol=1e-5)


def test_canonical_combine_is_independent_of_token_order_within_experts():
    # the same routing computed twice gives bit-identical output (fixed order)
    g = torch.Generator().manual_seed(0)
    experts = [tuple(torch.randn(s, generator=g) for s in [(4, 8), (4, 8), (8, 4)]) for _ in range(6)]
    from harness.model.experts import ExpertWeights

    experts = [ExpertWeights(*e) for e in experts]
    x = torch.randn(5, 8, generator=g)
    idx = torch.randint(0, 6, (5, 2), generator=g)
    w = torch.rand(5, 2, generator=g)
    a = compute_routed_experts(x, idx, w, experts)
    b = compute_routed_experts(x, idx, w, experts)
    assert torch.equal(a, b)


def test_block_causal_mask():
    pos = torch.arange(6)
    mask = block_causal_mask(pos, pos, block_length=2)
    assert mask[0].tolist() == [True, True, False, False, False, False]
    assert mask[3].tolist() == [True, True, True, True, False, False]
    assert mask[5].all()


def test_proxy_round_trip_gives_identical_logits(tmp_path, tiny_model):
    directory = ensure_proxy("tiny", tmp_path)
    reloaded = from_pretrained(directory)
    ids = torch.arange(10) + 5
    a = tiny_model(ids, torch.arange(10), 4)
    b = reloaded(ids, torch.arange(10), 4)
    assert torch.equal(a, b)


def test_proxy_keeps_real_routing_geometry():
    for name in ("mini", "flash"):
        proxy, real = proxy_config(name), LLaDA2Config.published(f"llada2_{name}")
        for key in ("num_hidden_layers", "first_k_dense_replace", "num_experts", "num_experts_per_tok",
                    "n_group", "topk_group", "num_shared_experts"):
            assert getattr(proxy, key) == getattr(real, key), key


def test_proxy_layout_is_sharded_hf(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["model_type"] == "llada2_moe" and cfg["proxy"] is True
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    assert "model.layers.1.mlp.experts.255.down_proj.weight" in index["weight_map"]
    assert "model.layers.1.mlp.gate.expert_bias" in index["weight_map"]
    assert (tiny_dir / "tokenizer.json").exists()


def test_tokenizer_has_mask_and_eos(tiny_tokenizer, tiny_model):
    assert tiny_tokenizer.mask_token_id == tiny_model.config.mask_token_id
    assert tiny_tokenizer.eos_token_id == tiny_model.config.eos_token_id
    ids = tiny_tokenizer.encode("def f(x): return x")
    assert tiny_tokenizer.decode(ids) == "def f(x): return x"


def test_incomplete_proxy_is_rebuilt(tmp_path):
    directory = ensure_proxy("tiny", tmp_path)
    shard = sorted(directory.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    assert not proxy_is_complete(directory)
    assert ensure_proxy("tiny", tmp_path) == directory
    assert proxy_is_complete(directory)
    from_pretrained(directory)


@pytest.fixture
def broken(tmp_path, tiny_dir) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, target)
    return target


def _first_shard(d: Path) -> Path:
    return sorted(d.glob("model-*.safetensors"))[0]


def test_missing_directory(tmp_path):
    with pytest.raises(HarnessError, match="does not exist"):
        from_pretrained(tmp_path / "nope")


def test_missing_shard(broken):
    _first_shard(broken).unlink()
    with pytest.raises(HarnessError, match="missing shard"):
        from_pretrained(broken)


def test_truncated_shard(broken):
    shard = _first_shard(broken)
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(HarnessError, match="truncated"):
        from_pretrained(broken)


def test_missing_key(broken):
    index_path = broken / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    from safetensors.torch import load_file, save_file

    shard = _first_shard(broken)
    tensors = load_file(str(shard))
    victim = "model.norm.weight" if "model.norm.weight" in tensors else next(iter(tensors))
    del tensors[victim]
    index["weight_map"].pop(victim)
    save_file(tensors, str(shard))
    index_path.write_text(json.dumps(index))
    with pytest.raises(HarnessError, match=f"no tensor {victim}"):
        from_pretrained(broken)


def test_config_disagrees_with_weights(broken):
    cfg = json.loads((broken / "config.json").read_text())
    cfg["moe_intermediate_size"] *= 2
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HarnessError, match=r"shape .* config.json implies"):
        from_pretrained(broken)


def test_layer_count_disagrees_with_weights(broken):
    cfg = json.loads((broken / "config.json").read_text())
    cfg["num_hidden_layers"] += 1
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HarnessError, match="num_hidden_layers"):
        from_pretrained(broken)


def test_wrong_model_type(broken):
    cfg = json.loads((broken / "config.json").read_text())
    cfg["model_type"] = "llama"
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HarnessError, match="llada2_moe"):
        from_pretrained(broken)


def test_single_file_checkpoint_loads(tmp_path, tiny_dir, tiny_model):
    from safetensors.torch import load_file, save_file

    target = tmp_path / "single"
    target.mkdir()
    tensors = {}
    for shard in sorted(tiny_dir.glob("model-*.safetensors")):
        tensors.update(load_file(str(shard)))
    save_file(tensors, str(target / "model.safetensors"))
    shutil.copy(tiny_dir / "config.json", target / "config.json")
    model = from_pretrained(target)
    ids = torch.arange(6)
    assert torch.equal(model(ids, ids, 4), tiny_model(ids, ids, 4))


def test_bf16_load_keeps_bf16_views(tiny_dir):
    model = from_pretrained(tiny_dir, dtype="bfloat16")
    assert model.lm_head.weight.dtype == torch.bfloat16
    logits = model(torch.arange(4), torch.arange(4), 4)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
