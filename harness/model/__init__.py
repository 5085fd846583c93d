"""LLaDA2-MoE: the model, checkpoint loading and proxy checkpoints (its entry, harness/zoo/llada2.py,
loads a configured model, building its proxy on first use)."""

from __future__ import annotations

from harness.model.config import LLaDA2Config
from harness.model.llada2 import KVCache, LLaDA2Model

__all__ = ["KVCache", "LLaDA2Config", "LLaDA2Model"]
