"""The transformers family entries, one per family: its stored config (the published
config.json with its source and the proxy's widths, harness/families/configs/<name>.json),
its decode driver and a line about it (docs/adding-a-model-family.md).

What every family shares: transformers' own modeling served through the bridge at the
experts interface (harness/families); a proxy with the published routing geometry at small
widths, seeded, its routers balanced on the LLaDA2 proxies' corpus and tokenized by their
tokenizer (so prompts encode to the same ids); the engine joined at the experts interface,
on the host (the device executor serves LLaDA2's layers only).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property, partial
from pathlib import Path
from typing import Any

from torch import nn

from harness.common.errors import HarnessError
from harness.common.files import fingerprint
from harness.decode.loading import DecodeDriver, Runner, eos_list
from harness.engine.engine import OffloadEngine
from harness.families.bridge import attach, detach
from harness.families.geometry import CONFIG_DIR, FamilyGeometry
from harness.families.loading import check_checkpoint, load_pretrained
from harness.families.proxies import build_proxy
from harness.families.registry import family_geometry
from harness.model.checkpoint import load_tokenizer
from harness.model.proxy import build_tokenizer, proxy_config
from harness.training.proxy_cache import corpus_for
from harness.zoo.ar_generate import ar_driver
from harness.zoo.diffusiongemma_generate import diffusiongemma_driver
from harness.zoo.entry import Capabilities, LoadedWeights, ModelConfig, ModelEntry, ModelNode, models_with

# the corpus texts a family proxy balances its routers on (as many as the LLaDA2 proxies use)
FAMILY_CALIBRATION_TEXTS = 40
# DALI's measures by default: prefill and token-by-token decode are DALI's setting
CAPABILITIES = Capabilities(measures_by_default=True)
SERVED = ("Served through transformers' own modeling and generate, the harness's experts implementation "
          "routing every MoE layer to the engine (docs/model-families.md). path: null -> a proxy with the real "
          "routing geometry at small widths (seeded, routers balanced on the stdlib corpus); the cost model and the "
          "budget charge the published geometry (its config in harness/families/configs, with its source).")


@dataclass(frozen=True)
class FamilyConfig:
    """A family's stored config file: `_source`, `adapter`, the published `config`, `proxy` widths."""

    name: str
    path: Path

    @cached_property
    def raw(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise HarnessError(f"model={self.name}: its config {self.path} is missing "
                               "(docs/adding-a-model-family.md)") from None
        except (OSError, ValueError) as exc:
            raise HarnessError(f"model={self.name}: cannot read its config {self.path} ({exc})") from None
        if not isinstance(raw, dict) or not {"adapter", "config"} <= set(raw):
            raise HarnessError(f"model={self.name}: {self.path} must be a JSON object with 'adapter' and 'config' "
                               "(docs/adding-a-model-family.md)")
        return raw

    @cached_property
    def geometry(self) -> FamilyGeometry:
        return family_geometry(self.name, self.raw)


def geometry(family: FamilyConfig, cfg: ModelConfig) -> FamilyGeometry:
    """The family's published geometry: a family is charged as itself."""
    if cfg.nominal != family.name:
        raise HarnessError(f"model.nominal={cfg.nominal}: model={cfg.name} is charged as its published geometry; "
                           f"leave model.nominal={family.name}")
    return family.geometry


def load(family: FamilyConfig, cfg: ModelConfig, cache_dir: Path) -> LoadedWeights:
    """Its checkpoint at model.path, or its cached proxy (built on first use)."""
    if cfg.path is not None:
        path, weights = Path(cfg.path), "real"
    else:
        tokenizer, texts = proxy_inputs()
        path = build_proxy(family.name, cfg.proxy_seed, cache_dir / "proxies", tokenizer, texts,
                           family_json=family.raw)
        weights = "random-proxy"
    if cfg.path is not None:
        adapter, _ = check_checkpoint(path)
        if adapter.name != family.raw["adapter"]:
            raise HarnessError(f"model.path={path} holds a {adapter.name} checkpoint, not {cfg.name}; "
                               f"use model={adapter.name}")
    # the weights' structure and finite values checked (once per checkpoint identity) before any decode
    loaded = load_pretrained(path, cfg.dtype, finite_cache=cache_dir / "finite", published=family.geometry)
    text = getattr(loaded.model.config, "text_config", None) or loaded.model.config
    return LoadedWeights(loaded.model, load_tokenizer(path), weights, path, eos_list(_eos(loaded.model)),
                         int(text.max_position_embeddings))


def proxy_identity(family: FamilyConfig, cfg: ModelConfig, cache_dir: Path) -> dict[str, Any]:
    """Its proxy is rebuilt from its seed, its stored config and the mini corpus by the code
    the artifacts fingerprint."""
    return {"weights": "random-proxy", "seed": cfg.proxy_seed, "corpus": corpus_for("mini").digest,
            "family_config": fingerprint(family.raw)}


@contextmanager
def bridged(model: nn.Module, engine: Runner) -> Iterator[Runner]:
    """The bridge hands every MoE layer's routing to the engine (OffloadEngine.route) and the
    model's own eager experts compute it, so every placement gives the stock model's bits."""
    if not isinstance(engine, OffloadEngine):
        raise HarnessError(f"the device executor (backend=cuda|standin) serves {models_with('device_backend')} "
                           "only; a transformers family runs with backend=cpu (modeled timing)")
    attach(model, engine)
    try:
        yield engine
    finally:
        detach(model)


@cache
def proxy_inputs() -> tuple[Any, list[str]]:
    """The tokenizer and calibration texts of the family proxies: the LLaDA2 mini proxy's
    stdlib tokenizer (so prompts encode as they do for LLaDA2) and its corpus."""
    corpus = corpus_for("mini")
    return build_tokenizer(proxy_config("mini").vocab_size, corpus.texts), corpus.texts[:FAMILY_CALIBRATION_TEXTS]


def _eos(model: nn.Module) -> int | list[int] | None:
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None) if generation is not None else None
    if eos is None:
        config = getattr(model.config, "text_config", None) or model.config
        eos = config.eos_token_id
    return eos


def family_entry(name: str, label: str, driver: DecodeDriver, about: str, config: Path | None = None) -> ModelEntry:
    """The entry of family `name`: its stored config (harness/families/configs/<name>.json
    unless `config` names another file), the driver that decodes it, and what it is."""
    family = FamilyConfig(name, config if config is not None else CONFIG_DIR / f"{name}.json")
    return ModelEntry(name=name, label=label, models=(ModelNode(name, name, f"{about} {SERVED}"),),
                      capabilities=CAPABILITIES, geometry=partial(geometry, family), load=partial(load, family),
                      proxy_identity=partial(proxy_identity, family), driver=driver, attach_engine=bridged)


# ---- the families: one entry each -----------------------------------------------------------

DIFFUSIONGEMMA = family_entry(
    "diffusiongemma", "DiffusionGemma", diffusiongemma_driver,
    "google/diffusiongemma-26B-A4B-it (25.2B total, 3.8B active): a causal encoder over the prompt and a "
    "bidirectional decoder denoising canvases of decode.block_length tokens with its own sampler (at most "
    "decode.steps steps a canvas); experts shared by encoder and decoder layers.")
QWEN3_MOE = family_entry(
    "qwen3_moe", "Qwen3-MoE", ar_driver,
    "Qwen/Qwen3-30B-A3B (30.5B total, 3.3B active): autoregressive, 48 MoE layers of 128 experts, top-8; "
    "decoded greedily with the KV cache (a 'block' is a window of decode.block_length tokens).")
MIXTRAL = family_entry(
    "mixtral", "Mixtral", ar_driver,
    "mistralai/Mixtral-8x7B (46.7B total, 12.9B active): autoregressive, 32 MoE layers of 8 experts, top-2; "
    "decoded greedily with the KV cache (a 'block' is a window of decode.block_length tokens).")
OLMOE = family_entry(
    "olmoe", "OLMoE", ar_driver,
    "allenai/OLMoE-1B-7B (6.9B total, 1.3B active): autoregressive, 16 MoE layers of 64 experts, top-8; "
    "decoded greedily with the KV cache (a 'block' is a window of decode.block_length tokens).")

FAMILIES = (DIFFUSIONGEMMA, QWEN3_MOE, MIXTRAL, OLMOE)
