"""The LLaDA2 entry: LLaDA2-MoE in this project's own code (harness/model), its three models
(tiny, mini, flash), their proxies (harness/training), the common block-diffusion loop
(harness/decode/decoding.py) and the engine on the model's MoE layers, on the host or
through the device executor (harness/hybrid)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.decode.decoding import DecodeOutput, DecodeSettings, OnForward, decode
from harness.decode.loading import LoadedModel, Runner, eos_list
from harness.hybrid.executor import wrap
from harness.model import KVCache, LLaDA2Config, LLaDA2Model
from harness.model.checkpoint import from_pretrained, load_tokenizer
from harness.model.proxy import proxy_config
from harness.training.proxy_cache import RESULT_WEIGHTS, ensure_weights, weights_at, weights_dir
from harness.zoo.entry import Capabilities, LoadedWeights, ModelConfig, ModelEntry, ModelNode

PROXY_NOTE = ("path: null -> proxy weights: random (seeded, expert bias balanced on the stdlib corpus; the default, "
              "docs/proxies.md) or model.weights=trained (trained on first use, python -m harness.train).")
MODELS = (
    ModelNode("tiny", "proxy", "Unit-test sized proxy: 3 layers (1 dense), 256 experts, top-8; charged as itself "
              "(its experts are tiny, copies cost almost nothing): a smoke-test model whose tokens/s does not "
              f"rank systems. {PROXY_NOTE}"),
    ModelNode("mini", "llada2_mini", "LLaDA2.0-mini (16.3B total, 1.43B active). The cost model and the budget "
              f"always charge the published geometry. {PROXY_NOTE}"),
    ModelNode("flash", "llada2_flash", "LLaDA2.0-flash (102.9B total, 6.15B active). The cost model and the budget "
              f"always charge the published geometry. {PROXY_NOTE}"),
)


def geometry(cfg: ModelConfig) -> LLaDA2Config:
    """The published geometry (harness/model/configs), or the proxy's own for nominal=proxy."""
    return proxy_config(cfg.name) if cfg.nominal == "proxy" else LLaDA2Config.published(cfg.nominal)


def load(cfg: ModelConfig, cache_dir: Path) -> LoadedWeights:
    """The checkpoint at model.path, or the cached proxy of model.weights' kind."""
    if cfg.path is not None:
        path = Path(cfg.path)
        weights = weights_at(path)  # a proxy directory (recipe=gpu, an experiment) says what it is
    else:
        path = ensure_weights(cfg.name, cache_dir / "proxies", cfg.proxy_seed, cfg.weights)
        weights = RESULT_WEIGHTS[cfg.weights]
    model = from_pretrained(path, cfg.dtype, finite_cache=cache_dir / "finite")
    model.set_expert_sum_order(cfg.expert_sum_order)
    return LoadedWeights(model, load_tokenizer(path), weights, path, eos_list(model.config.eos_token_id),
                         int(model.config.max_position_embeddings))


def proxy_identity(cfg: ModelConfig, cache_dir: Path) -> dict[str, Any]:
    """A proxy is rebuilt from its seed (and corpus) by the code the artifacts fingerprint;
    its directory name holds the corpus digest (and, trained, the training key)."""
    checkpoint = weights_dir(cfg.name, cache_dir / "proxies", cfg.proxy_seed, cfg.weights)
    return {"weights": RESULT_WEIGHTS[cfg.weights], "checkpoint": str(checkpoint.resolve())}


def decode_blocks(loaded: LoadedModel, ids: list[int], settings: DecodeSettings, hook: OnForward, prompt: int,
                  first_global_step: int) -> DecodeOutput:
    """One prompt with the common block-diffusion loop, gen_length trimmed to the prompt's
    bucket when decode.gen_length_bucket is set."""
    cfg = loaded.model.config
    return decode(loaded.model, ids, settings.for_prompt(len(ids)), cfg.mask_token_id, cfg.eos_token_id,
                  new_cache=KVCache, on_forward=hook, prompt_index=prompt, first_global_step=first_global_step)


@contextmanager
def engine_on_layers(model: LLaDA2Model, engine: Runner) -> Iterator[Runner]:
    """The model's MoE layers call the engine, or a device executor around it when the model
    is attached to a device (backend=cuda|standin); an executor made here is closed after."""
    runner = wrap(model, engine)
    previous = model.engine
    model.engine = runner
    model.reset_hint_state()  # each run's residual hints start from empty running means
    try:
        yield runner
    finally:
        model.engine = previous
        if runner is not engine:  # made here (calibration, reference): free its device slots
            runner.close()


LLADA2 = ModelEntry(
    name="llada2", label="LLaDA2", models=MODELS,
    capabilities=Capabilities(device_backend=True, trained_proxy=True, expert_sum_order=True, gen_length_bucket=True,
                              paper_budgets=True),
    geometry=geometry, load=load, proxy_identity=proxy_identity, driver=decode_blocks,
    attach_engine=engine_on_layers, experiment_prefix="llada2-",
)
