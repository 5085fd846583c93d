"""A configured model, ready to decode: real weights from `model.path`, or the cached proxy
of the same name and `model.weights` kind, built on first use. Two kinds of model sit
behind it: LLaDA2 in this project's own code (harness/model), and the transformers MoE
families (harness/families: transformers' own modeling, routed through the bridge).
Above harness/model, harness/training and harness/families, which it joins: a family
proxy takes the LLaDA2 proxies' tokenizer and corpus."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torch import nn

from harness.common.errors import HarnessError
from harness.families.geometry import FamilyGeometry
from harness.families.loading import load_pretrained
from harness.families.proxies import build_proxy
from harness.families.registry import nominal_geometry as family_geometry
from harness.model import LLaDA2Config
from harness.model.checkpoint import from_pretrained, load_tokenizer
from harness.model.proxy import build_tokenizer, proxy_config
from harness.training.proxy_cache import RESULT_WEIGHTS, corpus_for, ensure_weights, weights_at

if TYPE_CHECKING:
    from harness.model.settings import ModelConfig

ModelKind = Literal["llada2", "ar", "diffusion"]
# the corpus texts a family proxy balances its routers on (as many as the LLaDA2 proxies use)
FAMILY_CALIBRATION_TEXTS = 40


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any
    weights: str  # "real" | "trained-proxy" | "random-proxy"
    path: Path
    nominal: LLaDA2Config | FamilyGeometry  # the geometry the budget and the cost model charge
    kind: ModelKind = "llada2"  # how it decodes: LLaDA2's block diffusion, greedy AR, DiffusionGemma's sampler

    @property
    def eos_ids(self) -> list[int]:
        """The token ids that end a generation."""
        eos = self.model.config.eos_token_id if self.kind == "llada2" else _family_eos(self.model)
        return [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]) if e is not None]

    @property
    def max_positions(self) -> int:
        """The longest prompt + generation the loaded model's positions cover."""
        if self.kind == "llada2":
            return int(self.model.config.max_position_embeddings)
        config = getattr(self.model.config, "text_config", None) or self.model.config
        return int(config.max_position_embeddings)


def nominal_geometry(model_cfg: ModelConfig) -> LLaDA2Config | FamilyGeometry:
    """The published geometry the model's runs are charged as (the proxy's own for tiny)."""
    if model_cfg.is_family:
        return family_geometry(model_cfg.nominal)
    if model_cfg.nominal == "proxy":
        return proxy_config(model_cfg.name)
    return LLaDA2Config.published(model_cfg.nominal)


def load_model(model_cfg: ModelConfig, cache_dir: str | Path) -> LoadedModel:
    """Real weights from model.path, or the cached proxy of the same model name and
    `model.weights` kind (LLaDA2: trained or balanced random; a family: balanced random;
    built on first use)."""
    if model_cfg.is_family:
        return load_family(model_cfg, cache_dir)
    if model_cfg.path is not None:
        path = Path(model_cfg.path)
        weights = weights_at(path)  # a proxy directory (recipe=gpu, an experiment) says what it is
    else:
        kind = model_cfg.weights
        path = ensure_weights(model_cfg.name, Path(cache_dir) / "proxies", model_cfg.proxy_seed, kind)
        weights = RESULT_WEIGHTS[kind]
    model = from_pretrained(path, model_cfg.dtype)
    model.set_expert_sum_order(model_cfg.expert_sum_order)
    return LoadedModel(model, load_tokenizer(path), weights, path, nominal_geometry(model_cfg))


def load_family(model_cfg: ModelConfig, cache_dir: str | Path) -> LoadedModel:
    """A transformers family: its checkpoint at model.path, or its cached proxy."""
    if model_cfg.path is not None:
        path, weights = Path(model_cfg.path), "real"
    else:
        tokenizer, texts = family_proxy_inputs()
        path = build_proxy(model_cfg.name, model_cfg.proxy_seed, Path(cache_dir) / "proxies", tokenizer, texts)
        weights = "random-proxy"
    loaded = load_pretrained(path, model_cfg.dtype)
    nominal = nominal_geometry(model_cfg)
    if loaded.adapter.name != nominal.name and model_cfg.path is not None:
        raise HarnessError(f"model.path={path} holds a {loaded.adapter.name} checkpoint, not {model_cfg.name}; "
                           f"use model={loaded.adapter.name}")
    kind: ModelKind = "ar" if loaded.geometry.kind == "ar" else "diffusion"
    return LoadedModel(loaded.model, load_tokenizer(path), weights, path, nominal, kind)


@cache
def family_proxy_inputs() -> tuple[Any, list[str]]:
    """The tokenizer and calibration texts of the family proxies: the LLaDA2 mini proxy's
    stdlib tokenizer (so prompts encode as they do for LLaDA2) and its corpus."""
    corpus = corpus_for("mini")
    return build_tokenizer(proxy_config("mini").vocab_size, corpus.texts), corpus.texts[:FAMILY_CALIBRATION_TEXTS]


def _family_eos(model: nn.Module) -> int | list[int] | None:
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None) if generation is not None else None
    if eos is None:
        config = getattr(model.config, "text_config", None) or model.config
        eos = config.eos_token_id
    return eos
