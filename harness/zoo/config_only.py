"""The models known only by their config.json: no weights, no decode driver, no engine
hook-up; they replay imported routing traces (harness/traces/importing.py) and refuse a
live run (docs/real-routing.md).

  hf               any MoE model: model.path=<its config.json, or the directory holding it>
  qwen3_235b_a22b, deepseek_v3, gpt_oss_120b, llama4_scout
                   published configs stored with their source (harness/families/published)

Their geometry is counted from the model transformers builds for the config on the meta
device (harness/families/config_geometry.py); the cost model and the budget charge it.
"""

from __future__ import annotations

from harness.common.errors import HarnessError
from harness.families.config_geometry import ConfigGeometry, config_geometry, published_geometry
from harness.zoo.entry import Capabilities, ModelConfig, ModelEntry, ModelNode

HF = "hf"
REPLAYS = ("Replays imported routing traces only (source=trace trace.path=<trace.npz>, python -m harness.traces "
           "import; docs/real-routing.md); the cost model and the budget charge the geometry counted from the model "
           "transformers builds for the config on the meta device.")
MODELS = (
    ModelNode(HF, "config.json", "Any mixture-of-experts model named by its config.json: model.path=<config.json or "
              f"its directory>, read with transformers' AutoConfig. {REPLAYS}"),
    ModelNode("qwen3_235b_a22b", "qwen3_235b_a22b", "Qwen/Qwen3-235B-A22B (235B total, 22B active): 94 MoE layers of "
              f"128 experts, top-8. {REPLAYS}"),
    ModelNode("deepseek_v3", "deepseek_v3", "deepseek-ai/DeepSeek-V3 (671B total, 37B active): 3 dense then 58 MoE "
              f"layers of 256 experts, top-8, one shared expert, MLA. {REPLAYS}"),
    ModelNode("gpt_oss_120b", "gpt_oss_120b", "openai/gpt-oss-120b (116.8B total, 5.1B active): 36 MoE layers of "
              f"128 experts, top-4. {REPLAYS}"),
    ModelNode("llama4_scout", "llama4_scout", "meta-llama/Llama-4-Scout-17B-16E (109B total with vision, 17B active): "
              f"48 MoE layers of 16 experts, top-1, one shared expert. {REPLAYS}"),
)


def geometry(cfg: ModelConfig) -> ConfigGeometry:
    """model=hf: the config.json at model.path; a stored model: its published config."""
    if cfg.name == HF:
        if cfg.path is None:
            raise HarnessError("model=hf is known by its config.json only: give model.path=<config.json or the "
                               "directory holding it>")
        return config_geometry(cfg.path)
    if cfg.path is not None:
        raise HarnessError(f"model={cfg.name} is charged as its stored config (harness/families/published/"
                           f"{cfg.nominal}.json); a config.json of your own goes with model=hf model.path=<file>")
    if cfg.nominal != cfg.name:
        raise HarnessError(f"model.nominal={cfg.nominal}: model={cfg.name} is charged as its stored config; leave "
                           f"model.nominal={cfg.name}")
    return published_geometry(cfg.nominal)


CONFIG_ONLY = ModelEntry(
    name="config_only", label="config.json-only", models=MODELS,
    # DALI's measures by default: prefill and token-by-token decode are DALI's setting
    capabilities=Capabilities(live_decode=False, measures_by_default=True),
    geometry=geometry,
)
