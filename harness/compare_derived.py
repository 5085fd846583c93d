"""Check a derived no-cache trace against a real cache=none recording (slow: measurement).

    python -m harness.compare_derived <model> <gen_length> <n_prompts> [overrides ...]

Records the workload's first n prompts twice with every expert in place (prefix cache,
then no cache; block 32, 32 steps, threshold 0.95), derives the no-cache trace from the
first (`trace.derive_no_cache`) and prints whether tokens, steps and token counts agree
and how many (step, layer) pairs have different expert loads.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from harness.cli.overrides import compose_checked
from harness.decode.decoding import DecodeSettings
from harness.decode.workload import load_prompts
from harness.job.artifacts import record_trace
from harness.job.config import register_configs
from harness.placement.trace import derive_no_cache
from harness.zoo.entry import load_model


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m harness.compare_derived <model> <gen_length> <n_prompts> [overrides ...]",
              file=sys.stderr)
        return 2
    register_configs()
    model, gen, n = argv[0], int(argv[1]), int(argv[2])
    cfg = compose_checked([f"model={model}", "tracking.enabled=false", *argv[3:]])
    prompts = load_prompts(cfg.workload, n)
    settings = DecodeSettings(gen_length=gen, block_length=32, steps=32, threshold=0.95, cache="prefix")
    loaded = load_model(cfg.model, cfg.cache_dir)
    start = time.perf_counter()
    prefix, prefix_batch = record_trace(loaded, cfg, prompts, settings, "workload")
    prefix_s, start = time.perf_counter() - start, time.perf_counter()
    real, real_batch = record_trace(loaded, cfg, prompts, replace(settings, cache="none"), "workload")
    none_s = time.perf_counter() - start
    derived = derive_no_cache(prefix)
    same = [a.generated == b.generated for a, b in zip(prefix_batch.outputs, real_batch.outputs, strict=True)]
    print(f"model={model} gen={gen} prompts={len(prompts)} prefix_record_s={prefix_s:.1f} none_record_s={none_s:.1f}")
    print(f"tokens equal per prompt: {same}; steps equal: {derived.steps == real.steps}; "
          f"tokens/context equal: {derived.n_tokens == real.n_tokens and derived.n_context == real.n_context}")
    if derived.loads.shape != real.loads.shape:
        print(f"shapes differ: {tuple(derived.loads.shape)} vs {tuple(real.loads.shape)}")
        return 1
    differ = (derived.loads != real.loads).any(-1)
    print(f"(step, layer) pairs: {differ.numel()}, differing: {int(differ.sum())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
