"""Shared fixtures: one tiny proxy checkpoint per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from harness.model.checkpoint import from_pretrained, load_tokenizer
from harness.training.store import ensure_proxy

REPO = Path(__file__).resolve().parent.parent

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def proxy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_dir(proxy_cache: Path) -> Path:
    return ensure_proxy("tiny", proxy_cache / "proxies")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path):
    return from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir: Path):
    return load_tokenizer(tiny_dir)
