"""Ctrl-C that a failing `finally` swallows still stops the run (harness/common/interrupts.py):
CI once saw a sweep exit 0 after Ctrl-C because OmegaConf's restoring code turned the
KeyboardInterrupt into an AttributeError that the MLflow logging took for a store failure."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from harness.common import interrupts
from harness.job import mlflow_log


@pytest.fixture(autouse=True)
def no_ctrl_c_recorded():
    interrupts._received.clear()
    yield
    interrupts._received.clear()


def swallowed_ctrl_c() -> None:
    """A Ctrl-C whose KeyboardInterrupt a `finally` replaced by an ordinary error."""
    try:
        interrupts.on_sigint(signal.SIGINT, None)
    finally:
        raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")


def test_a_swallowed_ctrl_c_is_raised_again_at_the_next_boundary():
    with pytest.raises(AttributeError):
        swallowed_ctrl_c()
    assert interrupts.interrupted()
    with pytest.raises(KeyboardInterrupt):
        interrupts.raise_if_interrupted()


def test_without_ctrl_c_the_boundary_passes():
    interrupts.raise_if_interrupted()
    assert not interrupts.interrupted()


def test_logging_that_fails_because_of_ctrl_c_is_an_interrupt_not_a_warning(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(mlflow_log, "config_hash", lambda *a: "digest")
    monkeypatch.setattr(mlflow_log, "log_result", lambda *a: swallowed_ctrl_c())
    result = SimpleNamespace(config={}, identity=SimpleNamespace(backend="cpu"))
    tracking = SimpleNamespace(enabled=True, uri="sqlite:///x.db")
    with pytest.raises(KeyboardInterrupt):
        mlflow_log.log_run(result, tmp_path, tracking)
    assert "warning" not in capsys.readouterr().err


def test_logging_that_fails_on_its_own_is_a_warning(monkeypatch, capsys, tmp_path):
    def broken_store(*args):
        raise AttributeError("the store broke")

    monkeypatch.setattr(mlflow_log, "config_hash", lambda *a: "digest")
    monkeypatch.setattr(mlflow_log, "log_result", broken_store)
    result = SimpleNamespace(config={}, identity=SimpleNamespace(backend="cpu"))
    tracking = SimpleNamespace(enabled=True, uri="sqlite:///x.db")
    assert mlflow_log.log_run(result, tmp_path, tracking) is None
    assert "warning: MLflow logging skipped" in capsys.readouterr().err


def test_the_handler_replaces_only_pythons_own(monkeypatch):
    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        interrupts.install_sigint_handler()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # a background job stays deaf to Ctrl-C
        signal.signal(signal.SIGINT, signal.default_int_handler)
        interrupts.install_sigint_handler()
        assert signal.getsignal(signal.SIGINT) is interrupts.on_sigint
    finally:
        signal.signal(signal.SIGINT, previous)


# --------------------------------------------------------------------------- deferred_interrupts


def test_ctrl_c_inside_the_block_acts_when_the_block_ends(pythons_sigint_handler):
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts.deferred_interrupts():
        signal.raise_signal(signal.SIGINT)
        done.append("after the signal")
    assert done == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_inside_the_block_acts_at_once(pythons_sigint_handler):
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts.deferred_interrupts():
        signal.raise_signal(signal.SIGINT)
        done.append("after the first")
        signal.raise_signal(signal.SIGINT)
        done.append("after the second")
    assert done == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_inside_the_block_reaches_its_handler_at_the_end(pythons_sigint_handler):
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with interrupts.deferred_interrupts():
            signal.raise_signal(signal.SIGTERM)
            assert seen == []
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_ctrl_c_stays_ignored_and_a_quiet_block_changes_nothing():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.deferred_interrupts():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
