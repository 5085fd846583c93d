"""Routing statistics of the family proxies against the LLaDA2 mini random proxy, on the
same prompts (docs/adding-a-model-family.md: a family proxy must route at least as evenly).

    PYTHONPATH=. python scripts/family_routing_stats.py [--prompts 8] [--gen 32] [--cache outputs/cache] [--out FILE]

Every model decodes the first N HumanEval prompts (gen tokens each) and records each
forward's per-layer expert loads into a RoutingTrace; `harness.traces.routing_stats` computes the
statistics at B = E/4 (a quarter of each layer's experts), beside the same trace routed
uniformly at random. Autoregressive decode forwards are recorded as "denoise" steps of
32-token windows so the statistics that count denoising forwards see them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from harness.decode.decoding import DecodeSettings, decode
from harness.decode.workload import encode_prompt, read_humaneval_prompts
from harness.families.bridge import attach, detach
from harness.families.geometry import family_names
from harness.families.loading import load_pretrained
from harness.families.proxies import build_proxy
from harness.model import KVCache
from harness.model.checkpoint import from_pretrained, load_tokenizer
from harness.model.experts import LocalExperts, expert_load
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.traces.routing_stats import routing_statistics, uniform_statistics
from harness.training.proxy_cache import corpus_for, ensure_proxy
from harness.zoo.ar_generate import ar_generate
from harness.zoo.diffusiongemma_generate import diffusiongemma_generate

KEYS = ("load_entropy", "popularity_cv", "unused_experts_per_layer", "top_b_share", "top_b_share_step",
        "distinct_experts_per_layer_step", "cross_prompt_popularity_corr")


class TraceRouter:
    """The bridge's router (and LLaDA2's engine): each layer's load into the trace."""

    def __init__(self, trace: RoutingTrace) -> None:
        self.trace = trace

    def on_forward(self, info: StepInfo, n_tokens: int, n_context: int) -> None:
        self.trace.add_step(info, n_tokens, n_context)

    def route(self, layer: int, load: torch.Tensor, hint_fn) -> None:
        self.trace.record(layer, load)

    def run_experts(self, layer, x, topk_idx, topk_w, experts, hint_fn):  # LLaDA2's ExpertEngine
        self.trace.record(layer, expert_load(topk_idx, self.trace.n_experts))
        return LocalExperts().run_experts(layer, x, topk_idx, topk_w, experts, hint_fn)


def llada2_trace(cache: Path, prompts: list[list[int]], gen: int) -> RoutingTrace:
    directory = ensure_proxy("mini", cache / "proxies", 0)
    model = from_pretrained(directory)
    cfg = model.config
    trace = RoutingTrace(cfg.n_moe_layers, cfg.num_experts, meta={"denoise_steps": 0, "generated_tokens": 0})
    router = TraceRouter(trace)
    model.engine = router
    settings = DecodeSettings(gen_length=gen, block_length=32, steps=32, cache="prefix")
    for i, ids in enumerate(prompts):
        out = decode(model, ids, settings, cfg.mask_token_id, cfg.eos_token_id, new_cache=KVCache,
                     on_forward=router.on_forward, prompt_index=i, first_global_step=len(trace))
        trace.meta["generated_tokens"] += out.n_generated
    trace.meta["denoise_steps"] = sum(1 for s in trace.steps if s.kind == "denoise")
    return trace


def family_trace(name: str, cache: Path, tokenizer, texts, prompts: list[list[int]], gen: int) -> RoutingTrace:
    loaded = load_pretrained(build_proxy(name, 0, cache / "proxies", tokenizer, texts))
    g = loaded.geometry
    trace = RoutingTrace(g.n_moe_layers, g.num_experts, meta={"denoise_steps": 0, "generated_tokens": 0})
    router = TraceRouter(trace)
    attach(loaded.model, router)
    eos = int(tokenizer.eos_token_id)
    for i, ids in enumerate(prompts):
        if g.kind == "ar":
            out = ar_generate(loaded.model, ids, gen, eos, router.on_forward, 32, i, len(trace), "denoise")
        else:
            out = diffusiongemma_generate(loaded.model, ids, gen, 32, 16, 0, eos, router.on_forward, i, len(trace))
        trace.meta["generated_tokens"] += out.n_generated
    detach(loaded.model)
    trace.meta["denoise_steps"] = sum(1 for s in trace.steps if s.kind == "denoise")
    return trace


def row(name: str, trace: RoutingTrace, seconds: float) -> dict:
    b = max(1, trace.n_experts // 4)
    stats, uniform = routing_statistics(trace, b), uniform_statistics(trace, b)
    return {"model": name, "layers": trace.n_layers, "experts": trace.n_experts, "B": b, "forwards": len(trace),
            "seconds": round(seconds, 1), **{k: stats[k] for k in KEYS}, "uniform": {k: uniform[k] for k in KEYS}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--cache", type=Path, default=Path("outputs/cache"))
    parser.add_argument("--families", nargs="*", default=family_names())
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    directory = ensure_proxy("mini", args.cache / "proxies", 0)
    tokenizer = load_tokenizer(directory)
    texts = corpus_for("mini").texts[:40]
    prompts = [encode_prompt(tokenizer, p) for p in read_humaneval_prompts()[: args.prompts]]
    rows = []
    start = time.perf_counter()
    rows.append(row("llada2_mini (random proxy)", llada2_trace(args.cache, prompts, args.gen),
                    time.perf_counter() - start))
    for name in args.families:
        start = time.perf_counter()
        rows.append(row(f"{name} (family proxy)", family_trace(name, args.cache, tokenizer, texts, prompts, args.gen),
                        time.perf_counter() - start))
        print(json.dumps(rows[-1]), flush=True)
    print("| model | L x E | B | forwards | " + " | ".join(KEYS) + " |")
    for r in rows:
        cells = [f"{r[k]:.3f} (u {r['uniform'][k]:.3f})" if isinstance(r[k], float) else str(r[k]) for k in KEYS]
        print(f"| {r['model']} | {r['layers']} x {r['experts']} | {r['B']} | {r['forwards']} | " + " | ".join(cells))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
