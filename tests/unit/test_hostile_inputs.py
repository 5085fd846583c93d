"""Hostile inputs, round two (docs/bad-input.md): the files the harness reads. Every case is a
one-line HarnessError (exit 2 on the command line) that names the problem, in well under a
second, never a hang, a traceback or a silent accept, and nothing already written changes.
A damaged cached reference is the exception by design: it is recomputed, never compared.

The options, outputs and interrupts are in tests/unit/test_hostile_options.py; the first round's
catalogue in tests/integration/test_bad_inputs.py. Cases call the validating function directly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.cli.overrides import compose_checked
from harness.decode.decoding import DecodeSettings, decode
from harness.decode.lossless import load_reference, reference_path, store_reference
from harness.decode.workload import read_jsonl_prompts
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.model import shards
from harness.model.checkpoint import from_pretrained, read_shard_header
from harness.placement.trace import RoutingTrace
from tests import bad_input_cases as first
from tests import hostile_cases as cases
from tests.hostile_cases import no_hang, refused  # noqa: F401 - no_hang: an autouse fixture (a FIFO never hangs)

register_configs()


# ---------------------------------------------------------------- non-finite weights


@pytest.mark.parametrize("name", list(cases.NON_FINITE))
def test_non_finite_weights_are_refused_by_name(name, tiny_dir, tmp_path):
    directory = cases.poisoned_checkpoint(tiny_dir, tmp_path / "ckpt", name)
    before = first.snapshot(directory)
    refused(from_pretrained, cases.NON_FINITE[name][0], directory, finite_cache=tmp_path / "finite")
    assert first.snapshot(directory) == before and not (tmp_path / "finite").exists()


def test_a_passed_scan_is_remembered_per_checkpoint_identity(tiny_dir, tmp_path, monkeypatch):
    directory = tmp_path / "ckpt"
    import shutil

    shutil.copytree(tiny_dir, directory)
    from_pretrained(directory, finite_cache=tmp_path / "finite")
    assert len(list((tmp_path / "finite").glob("*.json"))) == 1
    calls = []
    scan = shards.first_non_finite
    monkeypatch.setattr(shards, "first_non_finite", lambda *a: calls.append(1) or scan(*a))
    from_pretrained(directory, finite_cache=tmp_path / "finite")
    assert calls == []  # remembered: no second pass over the weights
    cases.poison(directory, "lm_head.weight", "nan")  # a changed shard is another identity
    refused(from_pretrained, "lm_head.weight", directory, finite_cache=tmp_path / "finite")
    assert calls == [1]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_stop_the_decode(value):
    """Tokens picked from NaN logits would match an equally broken reference: lossless=1."""
    def model(ids, positions, block_length, cache=None, commit=False):
        logits = torch.zeros(len(ids), 16)
        logits[0, 3] = value
        return logits

    settings = DecodeSettings(gen_length=4, block_length=4, steps=2, cache="none")
    refused(decode, "NaN or Inf logits", model, [1, 2], settings, mask_id=15, eos_id=14)


def run_and_expect(overrides: list[str], cache: Path, run_dir: Path, needle: str) -> None:
    before = first.write_earlier_result(run_dir)
    cfg = compose_checked([*first_tiny(), f"cache_dir={cache}", *overrides])
    refused(run_job, needle, cfg, run_dir)
    assert first.snapshot(run_dir) == before


def first_tiny() -> list[str]:
    return ["model=tiny", "decode.gen_length=4", "decode.block_length=4", "decode.steps=2", "limit_prompts=1",
            "show_text=false", "tracking.enabled=false"]


@pytest.mark.parametrize("system", ["gpu_only", "tide"])
def test_a_run_on_nan_weights_never_reports_lossless(system, proxy_cache, tiny_dir, tmp_path):
    directory = cases.poisoned_checkpoint(tiny_dir, tmp_path / "ckpt", "lm_head NaN")
    run_and_expect([f"system={system}", f"model.path={directory}"], proxy_cache, tmp_path / "run", "lm_head")


# ---------------------------------------------------------------- safetensors and checkpoint files


@pytest.mark.parametrize("name", list(cases.OVERLAPS))
def test_overlapping_offsets_are_refused(name, tmp_path):
    path = cases.overlapping_shard(tmp_path / "model.safetensors", name)
    refused(read_shard_header, "overlap", path)


def test_adjacent_tensors_are_not_an_overlap(tmp_path):
    header = {"a": first._entry(), "b": first._entry(offsets=(16, 32)), "e": first._entry(shape=(0,), offsets=(16, 16))}
    path = first.write_shard(tmp_path / "model.safetensors", header, bytes(32))
    assert set(read_shard_header(path)) == {"a", "b", "e"}


@pytest.mark.parametrize("kind", ["fifo", "zero", "broken", "socket"])
def test_a_shard_that_is_not_a_regular_file(kind, tmp_path):
    path = cases.make_special(tmp_path / "model.safetensors", kind)
    refused(read_shard_header, cases.SPECIAL[kind], path)


CHECKPOINT_SPECIALS = [(m, k) for m in ("shard", *cases.CHECKPOINT_FILES) for k in ("fifo", "zero", "broken")]


@pytest.mark.parametrize(("member", "kind"), CHECKPOINT_SPECIALS, ids=[f"{m} {k}" for m, k in CHECKPOINT_SPECIALS])
def test_a_checkpoint_file_that_is_not_a_regular_file(member, kind, tiny_dir, tmp_path):
    directory = cases.checkpoint_with_special(tiny_dir, tmp_path / "ckpt", member, kind)
    refused(from_pretrained, cases.SPECIAL[kind], directory)


# ---------------------------------------------------------------- traces


@pytest.mark.parametrize("name", list(cases.TRACES))
def test_a_trace_that_is_not_what_it_claims(name, tmp_path):
    path = cases.broken_trace(tmp_path / "rec", name)
    before = first.snapshot(tmp_path)
    refused(RoutingTrace.load, cases.TRACES[name][1], path)
    assert first.snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir", "broken", "socket"])
def test_a_trace_that_is_not_a_regular_file(kind, tmp_path):
    path = cases.make_special(tmp_path / "trace.npz", kind)
    refused(RoutingTrace.load, cases.SPECIAL[kind], path)


ANALYZE = ["a .npy array", "loads declaring 2.6e15 elements", "an empty trace", "loads 100x the routed pairs"]


@pytest.mark.parametrize("name", ANALYZE)
def test_analyze_refuses_the_trace_in_one_line(name, tmp_path):
    from harness.analyze import main

    path = cases.broken_trace(tmp_path / "rec", name)
    before = first.snapshot(tmp_path)
    first.expect_tool_error(main, [f"trace={path}"], cases.TRACES[name][1])
    assert first.snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_analyze_and_bench_refuse_a_special_trace(kind, tmp_path):
    from harness.analyze import main as analyze
    from harness.bench import main as bench

    path = cases.make_special(tmp_path / "trace.npz", kind)
    first.expect_tool_error(analyze, [f"trace={path}"], cases.SPECIAL[kind])
    first.expect_tool_error(bench, [f"trace={path}", "model=tiny", "forward=false"], cases.SPECIAL[kind])


def test_a_good_trace_still_loads(tmp_path):
    trace = RoutingTrace.load(first.tiny_trace().save(tmp_path / "t.npz"))
    assert len(trace) == 8 and int(trace.loads.sum(-1).max()) <= 4 * 8


# ---------------------------------------------------------------- prompts files


@pytest.mark.parametrize("name", list(cases.PROMPT_FILES))
def test_a_prompts_file_with_bad_unicode_names_the_line(name, tmp_path):
    content, needle = cases.PROMPT_FILES[name]
    refused(read_jsonl_prompts, needle, cases.write_prompts(tmp_path, content), "prompt")


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir", "broken", "socket"])
def test_a_prompts_file_that_is_not_a_regular_file(kind, tmp_path):
    path = cases.make_special(tmp_path / "prompts.jsonl", kind)
    text = refused(read_jsonl_prompts, cases.SPECIAL[kind], path, "prompt")
    assert "does not exist" not in text


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = cases.write_prompts(tmp_path, b'\xef\xbb\xbf{"prompt": "def f():"}\n{"prompt": "caf\xc3\xa9"}\n')
    assert read_jsonl_prompts(path, "prompt") == ["def f():", "café"]


def test_a_prompt_with_bad_unicode_is_refused_by_a_run(proxy_cache, tiny_dir, tmp_path):
    path = cases.write_prompts(tmp_path, b'{"prompt": "\\ud800"}\n')
    run_and_expect(["workload=jsonl", f"workload.path={path}"], proxy_cache, tmp_path / "run", "invalid Unicode")


# ---------------------------------------------------------------- cached references


@pytest.mark.parametrize("how", cases.REFERENCE_DAMAGE)
def test_a_damaged_reference_is_recomputed_never_compared(how, tmp_path):
    store_reference(tmp_path, "k" * 16, [[5, 6, 7, 8], [1, 2, 3, 4]], {"model": "tiny"})
    assert load_reference(tmp_path, "k" * 16, (2, 4)) == [[5, 6, 7, 8], [1, 2, 3, 4]]
    cases.damage_reference(reference_path(tmp_path, "k" * 16), how)
    assert load_reference(tmp_path, "k" * 16, (2, 4)) is None


def test_a_reference_of_another_shape_is_not_used(tmp_path):
    store_reference(tmp_path, "k" * 16, [[5, 6, 7, 8]], {})
    assert load_reference(tmp_path, "k" * 16, (1, 4)) == [[5, 6, 7, 8]]
    assert load_reference(tmp_path, "k" * 16, (2, 4)) is None
    assert load_reference(tmp_path, "k" * 16, (1, 8)) is None


def test_a_damaged_reference_is_rebuilt_by_the_run(proxy_cache, tiny_dir, tmp_path):
    """A run over a tampered reference recomputes it: lossless stays 1, the file is repaired."""
    cfg = compose_checked([*first_tiny(), f"cache_dir={tmp_path / 'cache'}", "system=gpu_only"])
    import shutil

    shutil.copytree(proxy_cache / "proxies", tmp_path / "cache" / "proxies")
    run_job(cfg, tmp_path / "a")
    [entry] = (tmp_path / "cache" / "reference").glob("*.json")
    cases.damage_reference(entry, "a token edited")
    cfg = compose_checked([*first_tiny(), f"cache_dir={tmp_path / 'cache'}", "system=mixtral_offload"])
    result = run_job(cfg, tmp_path / "b")
    assert result.lossless["lossless"] == 1
    assert load_reference(tmp_path / "cache", entry.stem) is not None
