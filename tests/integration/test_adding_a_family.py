"""docs/adding-a-model-family.md, walked on a throwaway family: its config JSON and its entry
are all it takes for `model=<name>` to compose, build its proxy, decode live under an
offloading system losslessly and replay its own recording."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli.hints import group_options
from harness.cli.overrides import compose_checked
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.zoo.ar_generate import ar_driver
from harness.zoo.entry import registered
from harness.zoo.families import family_entry

register_configs()

# step 2 of the doc: the stored config (here a small OLMoE published as itself)
FAMILY_JSON = {
    "_source": {"hf_repo": "tests/throwaway", "config_url": "https://huggingface.co/tests/throwaway/config.json",
                "published_params": {"total": 0, "active": 0, "source": "a test"}},
    "adapter": "olmoe",
    "config": {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "vocab_size": 2048, "hidden_size": 64,
               "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": False, "hidden_act": "silu",
               "attention_bias": False, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
               "rope_theta": 10000.0, "tie_word_embeddings": False, "eos_token_id": 1, "pad_token_id": 1},
    "proxy": {"hidden_size": 32, "intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2},
}
RUN = ["decode.gen_length=4", "limit_prompts=1", "tracking.enabled=false", "budget=custom",
       "budget.experts_per_layer=2", "system=mixtral_offload"]


def test_a_family_is_its_config_json_and_its_entry(tmp_path: Path) -> None:
    config = tmp_path / "throwaway.json"
    config.write_text(json.dumps(FAMILY_JSON))
    # step 3: its entry (in harness/zoo/families.py it would sit beside the others, config=None)
    entry = family_entry("throwaway", "Throwaway", ar_driver, "A throwaway family for a test.", config=config)
    with registered(entry):
        assert "throwaway" in group_options("model")
        cfg = compose_checked(["model=throwaway", *RUN, f"cache_dir={tmp_path / 'cache'}", "trace.record=true"])
        assert (cfg.model.nominal, cfg.model.entry) == ("throwaway", entry)
        live = run_job(cfg, tmp_path / "live")
        m = live.flat_metrics()
        assert live.identity.model == "throwaway" and live.identity.weights == "random-proxy"
        assert m["lossless"] == 1 and m["missed_pairs"] > 0 and m["experts_per_layer"] == 2
        assert m["decode_steps"] == m["generated_tokens"] - 1  # its driver: greedy, one token a decode forward
        assert "cache_hit_rate_lru" in m  # a family's capability: DALI's measures by default
        proxy = Path(live.identity.checkpoint)
        assert proxy.name.startswith("family-throwaway-") and json.loads((proxy / "proxy.json").read_text())[
            "config"]["num_experts"] == 8  # the published routing geometry at the proxy's widths
        assert json.loads((proxy / "config.json").read_text())["hidden_size"] == 32
        replay = run_job(compose_checked(["model=throwaway", *RUN, f"cache_dir={tmp_path / 'cache'}", "source=trace",
                                          f"trace.path={tmp_path / 'live' / 'trace.npz'}"]), tmp_path / "replay")
        for key in ("modeled_time_s", "missed_pairs", "routed_pairs", "decode_steps"):
            assert replay.metrics[key] == live.metrics[key], key
    assert "throwaway" not in group_options("model")
