"""Train a proxy checkpoint:
`python -m harness.train model=<tiny|mini|flash> [recipe=cpu|gpu] [seed=0] [cache_dir=DIR]`.

Trains the proxy geometry as a masked-diffusion LM on the interpreter's stdlib sources
(harness/training), with a progress bar, and writes the checkpoint in the HF layout with
train_loss.csv, train_loss.png and training.json into the cache; a cached checkpoint is
reused. Then decodes one coding prompt with it, so the output can be eyeballed.
`python -m harness model=mini model.weights=trained` does the same training on first use.
recipe=gpu trains on CUDA with 200 times the tokens (harness/training/proxy_cache.py:
GPU_TRAIN_SETTINGS) into its own directory; use it with `model.path=<that directory>`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from harness.common.errors import HarnessError, exit_with
from harness.common.keyvalue import KeyValueCommand, Option, program_name
from harness.common.paths import probe_output_dir
from harness.decode.decoding import DecodeSettings, decode
from harness.model.checkpoint import from_pretrained, load_tokenizer
from harness.model.llada2 import KVCache
from harness.training.context_use import describe_context_use
from harness.training.proxy_cache import describe, ensure_trained, recipe, trained_dir

SAMPLE_PROMPT = "Write a Python function that returns the sum of the squares of a list of numbers."


COMMAND = KeyValueCommand("python -m harness.train", "train a proxy checkpoint (cached; reused when present)", [
    Option("model", "the proxy to train: tiny | mini | flash", required=True),
    Option("recipe", "cpu (the default budget) | gpu (200 times the tokens, on CUDA)"),
    Option("seed", "the training seed", "0"),
    Option("cache_dir", "the cache whose proxies/ receives it (default: $HARNESS_CACHE or outputs/cache)"),
    Option("sample", "decode one prompt with it afterwards: true | false"),
], example="python -m harness.train model=tiny")


def parse_args(argv: list[str]) -> dict[str, str]:
    COMMAND.prog = program_name(COMMAND.prog)
    return COMMAND.parse(argv)


def sample_text(directory: Path, prompt: str = SAMPLE_PROMPT, gen_length: int = 96) -> str:
    """Greedy threshold-0.95 block decoding of one prompt, as the harness decodes."""
    model, tokenizer = from_pretrained(directory), load_tokenizer(directory)
    settings = DecodeSettings(gen_length=gen_length, block_length=32, steps=32, threshold=0.95)
    cfg = model.config
    out = decode(model, list(tokenizer.encode(prompt)), settings, cfg.mask_token_id, cfg.eos_token_id,
                 new_cache=KVCache)
    return tokenizer.decode(out.generated[: out.n_generated])


MAX_SEED = 2**63 - 1


def seed_arg(args: dict[str, str]) -> int:
    text = args.get("seed", "0")
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_SEED:
        raise HarnessError(f"seed={text!r} must be an integer in [0, 2**63-1]")
    return int(text)


def sample_arg(args: dict[str, str]) -> bool:
    text = args.get("sample", "true").lower()
    if text not in ("true", "false"):
        raise HarnessError(f"sample={args['sample']!r} must be true or false")
    return text == "true"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    seed, sample = seed_arg(args), sample_arg(args)
    cache = Path(args.get("cache_dir", os.environ.get("HARNESS_CACHE", "outputs/cache"))) / "proxies"
    kind = args.get("recipe", "cpu")
    recipe(args["model"], kind)  # a bad name or no CUDA for recipe=gpu: one line, before anything is built
    probe_output_dir(cache, "cache_dir")  # not after the training: an unwritable cache fails now
    directory = trained_dir(args["model"], cache, seed, kind)
    cached = (directory / "PROXY_COMPLETE").exists()
    start = time.perf_counter()
    directory = ensure_trained(args["model"], cache, seed, kind)
    info = describe(directory)
    state = "cached" if cached else f"trained in {time.perf_counter() - start:.0f} s"
    print(f"{args['model']} trained proxy, recipe {kind} ({state}): {directory}")
    if info:
        print(f"  corpus {len(info['corpus']['files'])} stdlib files, {info['corpus']['bytes'] / 1e6:.1f} MB, "
              f"digest {info['corpus']['digest']}; {info['tokens_seen']:,} tokens seen in {info['settings']['steps']} "
              f"steps; loss {info['loss_first_10pct']:.2f} (first 10%) -> {info['loss_last_10pct']:.2f} (last 10%); "
              f"training wall {info['wall_s']:.0f} s")
        if "masked_ce_by_ratio" in info:  # older training.json files lack it
            print(f"  {describe_context_use(info['masked_ce_by_ratio'])}")
    if sample:
        print(f"  prompt: {SAMPLE_PROMPT!r}\n  output: {sample_text(directory)!r}")
    return 0


def cli() -> None:
    """The console script's entry point."""
    exit_with(main, sys.argv[1:])


if __name__ == "__main__":
    cli()
