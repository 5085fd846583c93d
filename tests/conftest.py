"""Shared fixtures: one tiny proxy checkpoint per test session."""

from __future__ import annotations

import os
import signal
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


@pytest.fixture
def pythons_sigint_handler():
    """Python's own Ctrl-C handler, as in a command (a test runner's worker may ignore SIGINT)."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


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


# ---- the end-to-end tier (real browser, the GPU script on the stand-in, SLURM) ------------------
# These drive outside programs whose own waits are wall-clock (a browser's answer, a page's
# render). On a loaded machine such a wait can run out without anything being wrong: then the
# test is reported skipped, naming the load, instead of failing (rerun alone: pytest -m e2e).
LOADED = 1.5  # load average per core above which a timeout counts as the machine's, not the code's
TIMEOUT_WORDS = ("timed out", "did not answer in time")


def machine_load() -> float:
    return os.getloadavg()[0] / (os.cpu_count() or 1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not (report.when == "call" and report.failed and item.get_closest_marker("e2e") and call.excinfo):
        return
    message = str(call.excinfo.value)
    load = machine_load()
    if any(word in message for word in TIMEOUT_WORDS) and load > LOADED:
        first = message.strip().splitlines()[0][:200] if message.strip() else "timed out"
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"e2e: timed out under load ({load:.1f} per core > {LOADED}): {first}; "
                           "rerun alone with: python -m pytest -m e2e")
