"""Shared fixtures: one tiny proxy checkpoint per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from harness.model.checkpoint import from_pretrained, load_tokenizer
from harness.training.proxy_cache import ensure_proxy

REPO = Path(__file__).resolve().parent.parent

# the cores shared among pytest-xdist's workers: more threads than cores makes torch's
# OpenMP threads spin against each other (the golden grid took 3x the CPU time at -n 2)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
if os.environ.get("HARNESS_TEST_THREADS"):  # a caller sharing the cores with other jobs sets its own share
    _THREADS = max(1, int(os.environ["HARNESS_TEST_THREADS"]))
torch.set_num_threads(_THREADS)
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))  # the runs tests start as subprocesses


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
