"""No-cache traces derived from a prefix-cached decode equal real no-cache recordings."""

from __future__ import annotations

from dataclasses import replace

import torch

from harness.cli.overrides import compose_checked
from harness.decode.decoding import DecodeSettings
from harness.job.artifacts import calibration_trace, record_trace, workload_trace
from harness.job.config import register_configs
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace, derive_no_cache
from harness.zoo.entry import load_model

register_configs()
# prompts shorter and longer than a block: partly filled first blocks, and a prefill
PROMPTS = ["Reverse a list.", "Write a Python class for a stack with push, pop, peek and is_empty methods, "
           "and a function that merges two sorted lists into one sorted list without using sort()."]
SETTINGS = DecodeSettings(gen_length=40, block_length=16, steps=5, threshold=0.9, cache="prefix")


def _cfg(cache_dir):
    return compose_checked(["model=tiny", f"cache_dir={cache_dir}", "tracking.enabled=false"])


def _record(cfg, settings: DecodeSettings) -> RoutingTrace:
    trace, _ = record_trace(load_model(cfg.model, cfg.cache_dir), cfg, PROMPTS, settings, "workload")
    return trace


def test_a_derived_no_cache_trace_equals_a_real_no_cache_recording_on_tiny(proxy_cache):
    cfg = _cfg(proxy_cache)
    prefix = _record(cfg, SETTINGS)
    assert {s.kind for s in prefix.steps} == {"prefill", "denoise", "commit"}
    real = _record(cfg, replace(SETTINGS, cache="none"))
    derived = derive_no_cache(prefix)
    assert derived.steps == real.steps
    assert derived.n_tokens == real.n_tokens and derived.n_context == real.n_context
    assert torch.equal(derived.loads, real.loads)  # every layer and step, exactly
    for s in range(len(real)):
        for layer in range(real.n_layers):
            torch.testing.assert_close(derived.hint(s, layer), real.hint(s, layer), rtol=1e-4, atol=1e-3)
    assert derived.meta["decode"]["cache"] == "none" and derived.meta["derived_from"] == "prefix"
    assert derived.meta["denoise_steps"] == real.meta["denoise_steps"] == len(real)


def test_derivation_adds_the_fixed_loads_of_prefill_and_commits():
    trace = RoutingTrace(1, 3)
    rows = [("prefill", [1, 0, 0], 4), ("denoise", [0, 2, 0], 4), ("commit", [0, 0, 3], 4),
            ("denoise", [0, 1, 1], 4), ("denoise", [5, 0, 0], 4)]
    for i, (kind, load, n) in enumerate(rows):
        trace.add_step(StepInfo(0, i, 0, i, False, kind), n, n)
        trace.record(0, torch.tensor(load))
    trace.add_step(StepInfo(1, 0, 0, 5, True, "denoise"), 4, 4)  # the next prompt starts afresh
    trace.record(0, torch.tensor([0, 0, 7]))
    derived = derive_no_cache(trace)
    assert derived.loads[:, 0].tolist() == [[1, 2, 0], [1, 1, 4], [6, 0, 3], [0, 0, 7]]
    assert derived.n_tokens == [8, 12, 12, 4]
    assert [s.global_step for s in derived.steps] == [0, 1, 2, 3]
    assert all(s.kind == "denoise" for s in derived.steps)


def test_no_cache_artifacts_are_derived_not_recorded(proxy_cache, monkeypatch):
    import harness.job.artifacts as artifacts

    cfg = _cfg(proxy_cache)
    settings = replace(SETTINGS, gen_length=16, cache="none")
    recorded: list[str] = []
    real_record = artifacts.record_trace

    def spy(loaded, cfg_, prompts, s, purpose):
        recorded.append(s.cache)
        return real_record(loaded, cfg_, prompts, s, purpose)

    monkeypatch.setattr(artifacts, "record_trace", spy)

    def loader():
        return load_model(cfg.model, cfg.cache_dir)

    trace, _ = workload_trace(cfg, PROMPTS[:1], settings, loader)
    calibration = calibration_trace(cfg, settings, loader)
    assert recorded == ["prefix", "prefix"]  # only prefix-cached decodes ran
    assert trace.meta["derived_from"] == "prefix" and calibration.meta["derived_from"] == "prefix"
    assert trace.meta["decode"]["cache"] == "none"
    again, _ = workload_trace(cfg, PROMPTS[:1], settings, loader)  # cached now
    assert recorded == ["prefix", "prefix"] and torch.equal(again.loads, trace.loads)
