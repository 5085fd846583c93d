"""Cached artifacts (harness/job/artifacts.py) are keyed by everything that decides their
contents: a reference from older model code, another torch, or a checkpoint replaced at
the same path is never reused (it would fail every lossless check of the new code)."""

from __future__ import annotations

import os
from pathlib import Path

import harness.job.artifacts as artifacts
from harness.cli.overrides import compose_checked
from harness.decode.decoding import DecodeSettings
from harness.decode.lossless import store_reference
from harness.job.artifacts import artifact_key, code_fingerprint, model_identity, reference_tokens
from harness.job.config import register_configs
from tests.harness_cli import TINY

register_configs()
SETTINGS = DecodeSettings(gen_length=4, block_length=4, steps=2)


def test_the_code_fingerprint_follows_every_byte_of_the_sources(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("x = 1.0 + 2.0\n")
    (tmp_path / "loop.py").write_text("steps = 4\n")
    before = code_fingerprint(tmp_path, ("model.py", "loop.py"))
    assert code_fingerprint(tmp_path, ("model.py", "loop.py")) == before
    (tmp_path / "model.py").write_text("x = 2.0 + 1.0\n")  # another summation order
    assert code_fingerprint(tmp_path, ("model.py", "loop.py")) != before


def test_a_reference_from_other_model_code_is_not_reused(tmp_path: Path, monkeypatch) -> None:
    cfg = compose_checked([*TINY, f"cache_dir={tmp_path}"])
    prompts = ["def add(a, b):"]
    key = artifact_key(cfg, SETTINGS, prompts)
    store_reference(tmp_path, key, [[1, 2, 3, 4]], model_identity(cfg))
    assert reference_tokens(cfg, SETTINGS, prompts) == (key, [[1, 2, 3, 4]])
    monkeypatch.setattr(artifacts, "numerics_fingerprint", lambda: "other-code")
    new_key, tokens = reference_tokens(cfg, SETTINGS, prompts)
    assert new_key != key and tokens is None  # recomputed, not trusted


def test_every_numerics_source_exists() -> None:
    root = Path(artifacts.__file__).resolve().parent.parent
    assert all((root / rel).is_file() for rel in artifacts.NUMERICS_SOURCES)


def test_a_checkpoint_replaced_at_the_same_path_gets_new_artifacts(tmp_path: Path) -> None:
    checkpoint = tmp_path / "LLaDA2.0-mini"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)
    cfg = compose_checked(["model=mini", f"model.path={checkpoint}"])
    before = model_identity(cfg)
    assert before["weights"] == "real"
    (checkpoint / "model.safetensors").write_bytes(b"\1" * 65)
    os.utime(checkpoint / "model.safetensors", ns=(1, 1))
    assert model_identity(cfg)["checkpoint_files"] != before["checkpoint_files"]
