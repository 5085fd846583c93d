"""Trained and balanced proxy checkpoints: their settings, cache keys and construction.

- trained proxies (`model.weights=trained`): the proxy geometry trained as a masked
  diffusion LM on the stdlib corpus (loop.py), cached under
  `<cache>/proxies/trained-<name>-seed<s>-<key>`, the key a digest of the geometry, the
  corpus digest, the training settings, the seed and the code that trains;
- random proxies (`model.weights=random`): seeded random weights whose expert bias is
  calibrated by the same balancing rule on no-grad forwards over the corpus.
Both are written through proxy.write_checkpoint and loaded through `from_pretrained`.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from harness.common.errors import HarnessError
from harness.common.files import fingerprint, write_json_atomic
from harness.model.llada2 import LLaDA2Model
from harness.model.proxy import (
    PROXY_SHAPES,
    PROXY_VERSION,
    build_tokenizer,
    init_weights,
    proxy_config,
    proxy_is_complete,
    publish_checkpoint,
    write_checkpoint,
)
from harness.training.balance import apply_balance, imbalance
from harness.training.context_use import masked_ce_by_ratio
from harness.training.corpus import Corpus, stdlib_corpus
from harness.training.forward import batched_forward
from harness.training.loop import TrainSettings, train, write_history
from harness.training.objective import mask_last_block, sample_windows

WEIGHT_KINDS = ("trained", "random")
RESULT_WEIGHTS = {"trained": "trained-proxy", "random": "random-proxy"}  # result.json's `weights`
# Sized for the training budgets of docs/proxies.md on a 2-core machine (tiny < 1 min, mini <= 10 min,
# flash <= 15 min, training included) with a margin for a shared machine: few steps, so
# the balancing step is larger than DeepSeek-V3's 1e-3 for the bias to settle in time.
TRAIN_SETTINGS: dict[str, TrainSettings] = {
    "tiny": TrainSettings(steps=40, tokens_per_step=512, max_context_blocks=1, warmup_steps=5,
                          balance_rate=5e-3, corpus_bytes=1_000_000),
    "mini": TrainSettings(steps=320, tokens_per_step=1024, warmup_steps=20, balance_rate=1e-2),
    "flash": TrainSettings(steps=240, tokens_per_step=1024, warmup_steps=20, balance_rate=1e-2),
}
# A recipe for a machine with CUDA (`python -m harness.train model=mini recipe=gpu`): 200
# times the tokens of the CPU recipe (65M), what the masked objective needs to leave its
# unigram plateau at this width (docs/results/2026-12-01-trained-proxies.md, "Where the
# masked objective stalls"). Big batches, few steps: at this width a GPU step costs its
# kernel launches (~7500), not its tokens.
# Sized by estimate (~0.1 s a step), never run yet: no GPU has been lent to these sessions.
# The rest (corpus, context blocks, learning rate) is the CPU recipe's: `corpus_for` reads it there.
GPU_TRAIN_SETTINGS: dict[str, TrainSettings] = {
    "tiny": replace(TRAIN_SETTINGS["tiny"], steps=200, tokens_per_step=4096, warmup_steps=20, balance_rate=2e-3),
    "mini": replace(TRAIN_SETTINGS["mini"], steps=2000, tokens_per_step=32768, warmup_steps=100, balance_rate=1e-3),
    "flash": replace(TRAIN_SETTINGS["flash"], steps=2000, tokens_per_step=32768, warmup_steps=100,
                     balance_rate=1e-3),
}
RECIPES = {"cpu": (TRAIN_SETTINGS, "cpu"), "gpu": (GPU_TRAIN_SETTINGS, "cuda")}  # settings, device
# the random proxies' bias calibration: no-grad forwards, the balancing rule with a step
# that shrinks linearly from the first to the last value
CALIBRATION_STEPS = {"tiny": 20, "mini": 40, "flash": 40}
CALIBRATION_TOKENS = 512
CALIBRATION_RATES = (2e-2, 2e-3)
# the code whose change makes a trained proxy stale, relative to harness/ (not
# training/context_use.py: it only measures the trained model for training.json)
TRAINING_SOURCES = ("training/balance.py", "training/corpus.py", "training/forward.py", "training/loop.py",
                    "training/objective.py", "training/proxy_cache.py", "model/llada2.py", "model/proxy.py",
                    "model/config.py")


def weights_at(path: Path) -> str:
    """result.json's `weights` of a checkpoint named by model.path: a proxy directory says
    what it is (training.json: trained, balance.json: balanced random); anything else is real."""
    if (path / "training.json").exists():
        return RESULT_WEIGHTS["trained"]
    return RESULT_WEIGHTS["random"] if (path / "balance.json").exists() else "real"


def check_kind(kind: str) -> None:
    if kind not in WEIGHT_KINDS:
        raise HarnessError(f"model.weights={kind!r} is not allowed; use trained or random")


def corpus_for(name: str) -> Corpus:
    if name not in PROXY_SHAPES:
        raise HarnessError(f"unknown proxy {name!r}; choose one of {', '.join(PROXY_SHAPES)}")
    return stdlib_corpus(TRAIN_SETTINGS[name].corpus_bytes)


def training_code_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(torch.__version__.encode())
    for rel in TRAINING_SOURCES:
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    return digest.hexdigest()[:16]


def training_key(geometry: dict, corpus_digest: str, settings: TrainSettings, seed: int, code: str,
                 device: str = "cpu") -> str:
    """What a trained checkpoint depends on; any change trains a new one (the device too:
    a GPU's kernels round differently from the CPU's)."""
    return fingerprint({"geometry": geometry, "corpus": corpus_digest, "settings": settings.as_dict(),
                        "seed": seed, "code": code, "device": device})


def recipe(name: str, kind: str) -> tuple[TrainSettings, str]:
    """(training settings, torch device) of a recipe: cpu (the default) or gpu."""
    if kind not in RECIPES:
        raise HarnessError(f"recipe={kind!r} is not one of {', '.join(RECIPES)}")
    if name not in PROXY_SHAPES:
        raise HarnessError(f"unknown proxy {name!r}; choose one of {', '.join(PROXY_SHAPES)}")
    settings, device = RECIPES[kind]
    if device == "cuda" and not torch.cuda.is_available():
        raise HarnessError("recipe=gpu trains on CUDA and this machine has no CUDA device; "
                           "use recipe=cpu here or run it on a GPU machine")
    return settings[name], device


def proxy_dir(name: str, cache_dir: str | Path, seed: int = 0) -> Path:
    """Where the balanced random proxy lives: keyed by name, seed, version and the corpus
    its tokenizer and its expert bias were calibrated on."""
    digest = corpus_for(name).digest[:8]
    return Path(cache_dir) / f"proxy-{name}-seed{seed}-v{PROXY_VERSION}-c{digest}"


def ensure_proxy(name: str, cache_dir: str | Path, seed: int = 0) -> Path:
    """The balanced random proxy checkpoint directory, written on first use and rebuilt if
    incomplete: seeded random weights, then the expert bias calibrated by the balancing
    rule on no-grad forwards over the corpus (harness/training/proxy_cache.py)."""
    directory = proxy_dir(name, cache_dir, seed)
    if proxy_is_complete(directory):
        return directory
    return publish_checkpoint(directory, lambda tmp: build_random_proxy(name, seed, tmp))


def trained_dir(name: str, cache_dir: str | Path, seed: int = 0, kind: str = "cpu") -> Path:
    """Where the proxy trained by recipe `kind` lives (the gpu recipe's name says so)."""
    table, device = RECIPES[kind]
    settings = table[name]
    key = training_key(proxy_config(name).to_dict(), corpus_for(name).digest, settings, seed,
                       training_code_digest(), device)
    tag = "" if kind == "cpu" else f"-{kind}"
    return Path(cache_dir) / f"trained-{name}{tag}-seed{seed}-{key}"


def ensure_trained(name: str, cache_dir: str | Path, seed: int = 0, kind: str = "cpu") -> Path:
    """The proxy trained by recipe `kind`, trained on first use."""
    settings, device = recipe(name, kind)
    return publish_checkpoint(trained_dir(name, cache_dir, seed, kind),
                              lambda tmp: train_proxy(name, seed, tmp, settings, device))


def weights_dir(name: str, cache_dir: str | Path, seed: int, kind: str) -> Path:
    """The checkpoint directory of a proxy of this kind (not built here)."""
    check_kind(kind)
    return trained_dir(name, cache_dir, seed) if kind == "trained" else proxy_dir(name, cache_dir, seed)


def ensure_weights(name: str, cache_dir: str | Path, seed: int, kind: str) -> Path:
    """The proxy checkpoint of this kind, built (trained or calibrated) on first use."""
    check_kind(kind)
    if kind == "random":
        return ensure_proxy(name, cache_dir, seed)
    return ensure_trained(name, cache_dir, seed)


# ---- construction ------------------------------------------------------------------------


def token_stream(tokenizer, corpus: Corpus, max_files: int | None = None) -> torch.Tensor:
    """The corpus as one token stream, files separated by the end-of-text token (so the
    model learns to end), in corpus order."""
    texts = list(corpus.texts[:max_files] if max_files else corpus.texts)
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in encoded:
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def init_for_training(model: LLaDA2Model, seed: int) -> None:
    """Unit-variance embeddings, 1/sqrt(fan_in) matrices, unit norms, zero expert bias."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("expert_bias"):
                p.zero_()
            elif name.endswith("word_embeddings.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def calibrate_bias(model: LLaDA2Model, stream: torch.Tensor, steps: int, seed: int) -> list[float]:
    """Balance a model's experts without training it: forwards over corpus windows masked
    as in training, each followed by the balancing rule; returns the imbalance per step."""
    gen = torch.Generator().manual_seed(seed)
    routers = [m.gate for m in model.moe_layers()]
    first, last = CALIBRATION_RATES
    history = []
    with torch.no_grad():
        for step in tqdm(range(steps), desc="balance expert bias", unit="step", leave=False, dynamic_ncols=True):
            length = 2 * 32
            clean = sample_windows(stream, max(1, CALIBRATION_TOKENS // length), length, gen)
            batch = mask_last_block(clean, 32, model.config.mask_token_id, gen)
            loads: list[torch.Tensor] = []
            batched_forward(model, batch.ids, 32, loads, last=1)
            rate = first + (last - first) * step / max(1, steps - 1)
            apply_balance(routers, loads, rate)
            history.append(imbalance(loads))
    return history


def build_random_proxy(name: str, seed: int, directory: Path) -> None:
    cfg = proxy_config(name)
    corpus = corpus_for(name)
    tokenizer = build_tokenizer(cfg.vocab_size, corpus.texts)
    model = LLaDA2Model(cfg)
    init_weights(model, seed)
    history = calibrate_bias(model, token_stream(tokenizer, corpus, max_files=40), CALIBRATION_STEPS[name], seed)
    write_checkpoint(model, directory, tokenizer)
    write_json_atomic(directory / "balance.json", {"imbalance_per_step": history, "corpus": corpus.manifest()})


def train_proxy(name: str, seed: int, directory: Path, settings: TrainSettings | None = None,
                device: str = "cpu") -> None:
    """Train the proxy geometry on `device` and write the checkpoint, the loss curve and a
    manifest. Initialization and batches are drawn on the host, so only the arithmetic
    runs on the device."""
    settings = settings or TRAIN_SETTINGS[name]
    torch.manual_seed(seed)
    cfg = proxy_config(name)
    corpus = corpus_for(name)
    start = time.perf_counter()
    tokenizer = build_tokenizer(cfg.vocab_size, corpus.texts)
    stream = token_stream(tokenizer, corpus)
    model = LLaDA2Model(cfg)
    init_for_training(model, seed)
    model.to(device)
    history = train(model, stream, settings, seed, desc=f"train {name} ({device})")
    block = settings.block_length
    context_use = masked_ce_by_ratio(lambda ids: batched_forward(model, ids.to(device), block, last=block).cpu(),
                                     stream, block, cfg.mask_token_id)
    model.to("cpu")
    write_checkpoint(model, directory, tokenizer)
    write_history(history, directory)
    tenth = max(1, len(history) // 10)
    manifest = {
        "model": name, "seed": seed, "settings": settings.as_dict(), "code": training_code_digest(),
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "corpus": corpus.manifest(), "corpus_tokens": int(stream.numel()),
        "tokens_seen": sum(r["tokens"] for r in history), "wall_s": round(time.perf_counter() - start, 1),
        "loss_first_10pct": sum(r["loss"] for r in history[:tenth]) / tenth,
        "loss_last_10pct": sum(r["loss"] for r in history[-tenth:]) / tenth,
        "final_imbalance": history[-1]["imbalance"] if history else None,
        "masked_ce_by_ratio": context_use,  # on corpus windows: does the model read its context?
    }
    write_json_atomic(directory / "training.json", manifest)


def describe(directory: Path) -> dict:
    path = directory / "training.json"
    return json.loads(path.read_text()) if path.exists() else {}
