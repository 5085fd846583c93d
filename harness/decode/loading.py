"""A configured model, ready to decode: real weights from `model.path`, or the cached proxy
of the same name and `model.weights` kind, built (balanced or trained) on first use. Above
both harness/model and harness/training, which builds proxies with the model package."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.model import LLaDA2Config, LLaDA2Model
from harness.model.checkpoint import from_pretrained, load_tokenizer
from harness.model.settings import nominal_geometry
from harness.training.proxy_cache import RESULT_WEIGHTS, ensure_weights, weights_at

if TYPE_CHECKING:
    from harness.model.settings import ModelConfig


@dataclass
class LoadedModel:
    model: LLaDA2Model
    tokenizer: object
    weights: str  # "real" | "trained-proxy" | "random-proxy"
    path: Path
    nominal: LLaDA2Config  # the geometry the budget and the cost model charge


def load_model(model_cfg: ModelConfig, cache_dir: str | Path) -> LoadedModel:
    """Real weights from model.path, or the cached proxy of the same model name and
    `model.weights` kind (trained or balanced random; built on first use)."""
    if model_cfg.path is not None:
        path = Path(model_cfg.path)
        weights = weights_at(path)  # a proxy directory (recipe=gpu, an experiment) says what it is
    else:
        kind = model_cfg.weights
        path = ensure_weights(model_cfg.name, Path(cache_dir) / "proxies", model_cfg.proxy_seed, kind)
        weights = RESULT_WEIGHTS[kind]
    # the NaN/Inf scan of the weights is remembered per checkpoint identity (harness/model/checkpoint.py)
    model = from_pretrained(path, model_cfg.dtype, finite_cache=Path(cache_dir) / "finite")
    return LoadedModel(model, load_tokenizer(path), weights, path, nominal_geometry(model_cfg))
