"""The transformers MoE families (docs/model-families.md, model layer): published geometry, the bridge at
transformers' experts interface, checkpoint loading and its errors, proxies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.common.errors import HarnessError
from harness.families.bridge import IMPLEMENTATION, attach, detach
from harness.families.geometry import CONFIG_DIR, family_names, read_family_json
from harness.families.loading import load_pretrained
from harness.families.proxies import balance_routers, build_proxy, calibration_batch, proxy_config
from harness.families.registry import family_adapter, geometry_of, nominal_geometry
from harness.model.proxy import build_tokenizer
from tests.family_models import FAMILIES, IDS, VOCAB, RecordingRouter, forward_logits, tiny_model

# what harness/accounting/cost.py and budget.py read from LLaDA2Config
COST_MODEL_NAMES = ("hidden_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "n_moe_layers",
                    "expert_params", "attention_params", "non_expert_params", "total_params", "active_params",
                    "num_key_value_heads", "head_dim", "num_attention_heads", "vocab_size", "first_k_dense_replace",
                    "num_shared_experts", "intermediate_size", "tie_word_embeddings", "num_hidden_layers")


# ---- nominal geometry -------------------------------------------------------------------


def test_every_family_config_cites_its_source_and_has_a_tiny_config_for_these_tests():
    assert set(FAMILIES) == set(family_names()), "add the family's tiny config to TINY in tests/family_models.py"
    for name in family_names():
        source = read_family_json(name)["_source"]
        assert source["hf_repo"] and source["config_url"].startswith("https://huggingface.co/")
        assert source["config_url"].endswith("/config.json")
        assert source["published_params"]["source"]


@pytest.mark.parametrize("name", family_names())
def test_geometry_counts_the_parameters_transformers_builds(name):
    """The geometry's totals equal the parameters of the model transformers builds (on the
    meta device) from the published config: the text stack, vision tower left out."""
    geometry, adapter = nominal_geometry(name), family_adapter(name)
    with torch.device("meta"):
        model = adapter.from_config(adapter.hf_config(read_family_json(name)["config"]))
    params = {n: p.numel() for n, p in model.named_parameters() if "vision" not in n}
    experts = sum(n for key, n in params.items() if key.endswith(("experts.gate_up_proj", "experts.down_proj")))
    assert sum(params.values()) == geometry.total_params
    assert experts == geometry.n_moe_layers * geometry.num_experts * geometry.expert_params


@pytest.mark.parametrize("name", family_names())
def test_total_and_active_params_within_two_percent_of_the_published_figures(name):
    geometry = nominal_geometry(name)
    published = read_family_json(name)["_source"]["published_params"]
    assert abs(geometry.total_params / published["total"] - 1) < 0.02
    assert abs(geometry.active_params / published["active"] - 1) < 0.02


def test_geometry_offers_what_the_cost_model_reads():
    for name in family_names():
        g = nominal_geometry(name)
        for attr in COST_MODEL_NAMES:
            assert getattr(g, attr) is not None, (name, attr)
        assert g.expert_bytes(2) == 2 * g.expert_params and g.non_expert_bytes(2) == 2 * g.non_expert_params
        assert g.n_moe_layers + g.first_k_dense_replace == g.num_hidden_layers


def test_published_routing_geometry():
    expect = {"mixtral": (32, 32, 8, 2), "qwen3_moe": (48, 48, 128, 8), "olmoe": (16, 16, 64, 8),
              "diffusiongemma": (30, 30, 128, 8)}
    for name, (layers, moe, experts, k) in expect.items():
        g = nominal_geometry(name)
        assert (g.num_hidden_layers, g.n_moe_layers, g.num_experts, g.num_experts_per_tok) == (layers, moe, experts, k)
    dg = nominal_geometry("diffusiongemma")
    assert dg.kind == "diffusion" and dg.num_shared_experts == 3  # its 2112-wide dense MLP = 3 experts of 704
    assert nominal_geometry("mixtral").num_shared_experts == 0


def test_sparse_layers_follow_qwen_and_deepseek_rules():
    adapter = family_adapter("qwen3_moe")
    base = {"num_hidden_layers": 6}
    assert adapter.sparse_layers(base) == (0, 1, 2, 3, 4, 5)
    assert adapter.sparse_layers({**base, "decoder_sparse_step": 2, "mlp_only_layers": [3]}) == (1, 5)
    assert adapter.sparse_layers({**base, "first_k_dense_replace": 2}) == (2, 3, 4, 5)
    g = adapter.geometry("q", {**proxy_config("qwen3_moe", VOCAB, IDS), "num_hidden_layers": 4, "mlp_only_layers": [0]})
    assert g.sparse_layers == (1, 2, 3) and g.first_k_dense_replace == 1 and g.moe_index(3) == 2
    with pytest.raises(HarnessError, match="no routed experts"):
        g.moe_index(0)


def test_proxy_keeps_the_published_routing_geometry_at_small_widths():
    for name in family_names():
        adapter, published = family_adapter(name), nominal_geometry(name)
        proxy = adapter.geometry(name, proxy_config(name, 2048, IDS))
        assert (proxy.num_hidden_layers, proxy.sparse_layers, proxy.num_experts, proxy.num_experts_per_tok) == (
            published.num_hidden_layers, published.sparse_layers, published.num_experts, published.num_experts_per_tok)
        assert proxy.hidden_size == 64 and proxy.vocab_size == 2048


# ---- the bridge -----------------------------------------------------------------------------


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm"])
@pytest.mark.parametrize("name", FAMILIES)
def test_bridged_logits_equal_the_stock_model_bit_for_bit(name, implementation):
    """Whatever experts implementation the model was loaded with (transformers' default is
    grouped_mm), the bridged model computes with it: the same logits to the bit."""
    adapter, model = tiny_model(name)
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    model.set_experts_implementation(implementation)
    stock = forward_logits(adapter, model, ids)
    router = RecordingRouter()
    attach(model, router)
    bridged = forward_logits(adapter, model, ids)
    detach(model)
    assert torch.equal(stock, bridged)
    g = geometry_of(model)
    stacks = 2 if adapter.kind == "diffusion" else 1
    assert [layer for layer, _, _ in router.calls] == list(range(g.n_moe_layers)) * stacks
    for layer, load, hint in router.calls:
        assert load.dtype == torch.int64 and load.shape == (g.num_experts,)
        tokens = ids.shape[1] // stacks
        assert int(load.sum()) == tokens * g.num_experts_per_tok
        assert (hint is None) == (layer == g.n_moe_layers - 1)
    assert model.config._experts_implementation == implementation
    assert all(not hasattr(s.experts, "_harness_slot") for s in adapter.moe_sites(model, g))


def test_hint_is_the_next_moe_layers_router_on_this_layers_router_input():
    """qwen3 tiny: decoder layer 1 is dense, so MoE layer 0's hint comes from decoder layer 2's gate."""
    adapter, model = tiny_model("qwen3_moe")
    gates = [model.model.layers[0].mlp.gate, model.model.layers[2].mlp.gate]
    seen: list[torch.Tensor] = []
    hook = gates[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    router = RecordingRouter()
    attach(model, router)
    forward_logits(adapter, model, torch.arange(10)[None])
    detach(model)
    hook.remove()
    expected = torch.softmax(torch.nn.functional.linear(seen[0], gates[1].weight).float(), dim=-1).sum(0)
    assert torch.equal(router.calls[0][2], expected)


def test_attach_twice_and_the_implementation_without_a_bridge_are_errors():
    _, model = tiny_model("mixtral")
    attach(model, RecordingRouter())
    with pytest.raises(HarnessError, match="already attached"):
        attach(model, RecordingRouter())
    detach(model)
    model.set_experts_implementation(IMPLEMENTATION)
    with pytest.raises(RuntimeError, match="without a bridge"):
        model(input_ids=torch.arange(4)[None])


# ---- checkpoints ----------------------------------------------------------------------------


def _saved(tmp_path: Path, name: str = "qwen3_moe") -> tuple[Path, torch.nn.Module]:
    _, model = tiny_model(name)
    model.save_pretrained(str(tmp_path))
    return tmp_path, model


def _edit_config(path: Path, **changes) -> None:
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))


def test_load_pretrained_round_trips_a_checkpoint(tmp_path):
    path, model = _saved(tmp_path)
    loaded = load_pretrained(path)
    ids = torch.arange(8)[None]
    model.set_experts_implementation("eager")
    loaded.model.set_experts_implementation("eager")
    assert torch.equal(forward_logits(loaded.adapter, loaded.model, ids), forward_logits(loaded.adapter, model, ids))
    assert loaded.geometry.sparse_layers == (0, 2) and loaded.adapter.name == "qwen3_moe"


def test_unknown_family_and_model_types_without_an_adapter_are_one_line_errors(tmp_path):
    with pytest.raises(HarnessError, match=r"unknown model family 'gpt5'.*diffusiongemma, mixtral, olmoe, qwen3_moe"):
        nominal_geometry("gpt5")
    path, _ = _saved(tmp_path)
    _edit_config(path, model_type="llama")
    with pytest.raises(HarnessError, match=r"model_type='llama'.*allowed: diffusion_gemma, mixtral, olmoe, qwen3_moe"):
        load_pretrained(path)


def test_geometries_the_bridge_cannot_serve_are_errors(tmp_path):
    path, _ = _saved(tmp_path)
    _edit_config(path, mlp_only_layers=[0, 1, 2])
    with pytest.raises(HarnessError, match="no decoder layer has routed experts"):
        load_pretrained(path)
    _edit_config(path, mlp_only_layers=[1], num_experts_per_tok=9)
    with pytest.raises(HarnessError, match="top-k 9 exceeds the 8 experts"):
        load_pretrained(path)
    _edit_config(path, num_experts_per_tok=2, quantization_config={"bits": 4})
    with pytest.raises(HarnessError, match="quantized"):
        load_pretrained(path)


def test_checkpoints_without_safetensors_or_config_are_errors(tmp_path):
    with pytest.raises(HarnessError, match=r"missing .*config\.json"):
        load_pretrained(tmp_path)
    path, _ = _saved(tmp_path)
    for weights in path.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(HarnessError, match="safetensors only"):
        load_pretrained(path)


# ---- proxies --------------------------------------------------------------------------------


def test_balancing_evens_out_a_random_router():
    """On a model whose routing inputs share a strong common component, the balancing rule
    lowers the heaviest-expert/mean load ratio it measures."""
    adapter, model = tiny_model("olmoe")
    with torch.no_grad():
        for layer in model.model.layers:  # a common component every router row sees differently
            layer.post_attention_layernorm.weight.add_(torch.linspace(0, 4, 32))
    batch = torch.randint(0, VOCAB - 1, (4, 32), generator=torch.Generator().manual_seed(0))
    history = balance_routers(model, adapter, batch, passes=2)
    assert history[-1] < history[0]


def test_build_proxy_caches_by_config_and_reloads(tmp_path):
    texts = ["def f(x):\n    return x + 1\n" * 20, "class A:\n    pass\n" * 20]
    tokenizer = build_tokenizer(512, texts)
    shrink = {"num_hidden_layers": 2, "num_local_experts": 4, "hidden_size": 16, "intermediate_size": 8,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}
    first = build_proxy("mixtral", 0, tmp_path, tokenizer, texts, shrink)
    assert build_proxy("mixtral", 0, tmp_path, tokenizer, texts, shrink) == first
    assert build_proxy("mixtral", 1, tmp_path, tokenizer, texts, shrink) != first
    assert any(first.glob("*.safetensors")) and (first / "tokenizer.json").exists()
    loaded = load_pretrained(first)
    assert loaded.geometry.vocab_size == len(tokenizer) == 512
    assert loaded.model.config.eos_token_id == tokenizer.eos_token_id
    info = json.loads((first / "proxy.json").read_text())
    assert info["family"] == "mixtral" and len(info["imbalance_per_pass"]) == 4
    assert calibration_batch(tokenizer, texts, 0).shape[1] <= 128


def test_family_configs_are_package_data():
    pyproject = (CONFIG_DIR.parents[2] / "pyproject.toml").read_text()
    assert "families/configs/*.json" in pyproject


def test_proxy_init_scales_the_residual_branch_outputs():
    """GPT-2's init: o_proj and down_proj draw 1/sqrt(2 * layers) of the other matrices'
    1/sqrt(fan_in) scale (q_proj and o_proj have the same fan-in here)."""
    _, model = tiny_model("qwen3_moe")  # 3 layers
    attn = model.model.layers[0].self_attn
    ratio = float(attn.o_proj.weight.std() / attn.q_proj.weight.std())
    assert abs(ratio / (2 * 3) ** -0.5 - 1) < 0.1


def test_a_transformers_without_the_model_class_is_one_line() -> None:
    from dataclasses import replace

    older = replace(family_adapter("diffusiongemma"), model_class="NoSuchModelForBlockDiffusion")
    with pytest.raises(HarnessError, match=r"model=diffusiongemma needs transformers' NoSuchModelForBlockDiffusion.*"
                                           r"pip install -U"):
        older.model_cls()
