"""Turning a Hydra node (or a plain dict) into a config dataclass, with one-line errors."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from harness.errors import HarnessError

T = TypeVar("T")


def as_dataclass(cfg: Any, cls: type[T], what: str) -> T:
    """`cfg` as an instance of `cls`: a DictConfig, a structured config or a dict; an
    unknown key is a HarnessError naming the known ones."""
    if isinstance(cfg, cls):
        return cfg
    from omegaconf import OmegaConf  # only Hydra callers pass a DictConfig

    raw = OmegaConf.to_object(cfg) if OmegaConf.is_config(cfg) else dict(cfg)
    if isinstance(raw, cls):
        return raw
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise HarnessError(f"unknown {what} key(s) {unknown}; known: {sorted(known)}")
    return cls(**raw)
