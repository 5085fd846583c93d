"""LLaDA2-MoE: the model, checkpoint loading and proxy checkpoints (harness/decode/loading.py
loads a configured model, building its proxy on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.model.config import LLaDA2Config
from harness.model.llada2 import KVCache, LLaDA2Model
from harness.model.proxy import proxy_config

if TYPE_CHECKING:
    from harness.cli.config_parts import ModelConfig

__all__ = ["KVCache", "LLaDA2Config", "LLaDA2Model", "nominal_geometry"]


def nominal_geometry(model_cfg: ModelConfig) -> LLaDA2Config:
    if model_cfg.nominal == "proxy":
        return proxy_config(model_cfg.name)
    return LLaDA2Config.published(model_cfg.nominal)
