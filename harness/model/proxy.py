"""Proxy checkpoints in the real LLaDA2 checkpoint layout: seeded random weights with a
balanced expert bias (built by `ensure_proxy` in harness/training/proxy_cache.py), and the
writer that balanced and trained proxies share.

No weights can be downloaded where this harness is developed, so it writes its own
checkpoints (config.json with the real key names, sharded safetensors + index,
tokenizer files) and loads them through the same `from_pretrained` as real weights.
`mini` and `flash` keep the real routing geometry (layer count, first dense layer, 256
experts, top-8, 8 groups / keep 4, one shared expert) with small hidden sizes, so
routing traces have the real shape; `tiny` is small enough for unit tests.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from harness.common.errors import HarnessError
from harness.common.files import publish_dir
from harness.model.checkpoint import INDEX_FILE, index_checkpoint
from harness.model.config import LLaDA2Config
from harness.model.llada2 import LLaDA2Model

PROXY_VERSION = 3  # 3: stdlib tokenizer, balanced expert bias stored in fp32
_ROUTING = dict(num_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4, num_shared_experts=1)
PROXY_SHAPES: dict[str, dict] = {
    "tiny": dict(
        vocab_size=512, hidden_size=32, intermediate_size=64, moe_intermediate_size=8, num_hidden_layers=3,
        first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16, **_ROUTING,
    ),
    "mini": dict(
        vocab_size=2048, hidden_size=64, intermediate_size=160, moe_intermediate_size=16, num_hidden_layers=20,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=1, head_dim=16, **_ROUTING,
    ),
    "flash": dict(
        vocab_size=2048, hidden_size=64, intermediate_size=160, moe_intermediate_size=16, num_hidden_layers=32,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=1, head_dim=16, **_ROUTING,
    ),
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|mask|>", "<|role_start|>", "<|role_end|>"]
SHARD_BYTES = 32 * 2**20

def proxy_config(name: str) -> LLaDA2Config:
    if name not in PROXY_SHAPES:
        raise HarnessError(f"unknown proxy {name!r}; choose one of {', '.join(PROXY_SHAPES)}")
    shape = PROXY_SHAPES[name]
    vocab = shape["vocab_size"]
    return LLaDA2Config(**shape, eos_token_id=vocab - 4, mask_token_id=vocab - 3)


def build_tokenizer(vocab_size: int, texts: Sequence[str]):
    """Byte-level BPE trained on `texts` (the stdlib corpus); special tokens take the last ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    n_regular = vocab_size - len(SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=n_regular, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    # pad with unused tokens so the special tokens land on fixed ids at the end
    filler = [f"<|reserved_{i}|>" for i in range(n_regular - tok.get_vocab_size())]
    tok.add_tokens(filler)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", mask_token="<|mask|>", pad_token="<|endoftext|>"
    )


def init_weights(model: LLaDA2Model, seed: int) -> None:
    """Seeded random weights scaled so that a proxy behaves like a trained model in the
    ways the harness measures: unit-variance embeddings and 1/sqrt(fan_in) matrices keep
    position and context visible in the output (so tokens differ across positions and
    some are confident enough for the threshold rule), and a sharp router gives each
    token a distinct, stable set of experts."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("expert_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
            elif name.endswith("word_embeddings.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                gain = {"lm_head.weight": 6.0, "mlp.gate.weight": 2.0}.get(
                    next((k for k in ("lm_head.weight", "mlp.gate.weight") if name.endswith(k)), ""), 1.0
                )
                p.copy_(torch.randn(p.shape, generator=gen) * gain / fan_in**0.5)


def write_checkpoint(model: LLaDA2Model, directory: Path, tokenizer=None) -> None:
    """Write config.json, sharded bf16 safetensors with an index, and the tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    raw = json.loads((Path(__file__).parent / "configs" / "llada2_mini.json").read_text())
    raw.update(cfg.to_dict())
    raw["rotary_dim"] = cfg.rotary_dim
    raw["pad_token_id"] = cfg.eos_token_id
    raw["proxy"] = True
    (directory / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True))

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in model.state_dict().items():
        nbytes = tensor.numel() * 2
        if size + nbytes > SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        # the expert bias stays fp32, as in the published checkpoints: its steps (1e-3) are
        # below bf16's resolution near 1, and it only selects experts
        dtype = torch.float32 if name.endswith("expert_bias") else torch.bfloat16
        shards[-1][name] = tensor.detach().to(dtype).contiguous()
        size += nbytes
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


def proxy_is_complete(directory: Path) -> bool:
    marker = directory / "PROXY_COMPLETE"
    if not marker.exists() or marker.read_text().strip() != str(PROXY_VERSION):
        return False
    try:
        index_checkpoint(directory)
    except HarnessError:
        return False
    return (directory / "tokenizer.json").exists()


def publish_checkpoint(directory: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp)` into a temporary sibling, mark it complete and rename it into place,
    so an interrupted write never leaves a directory that looks complete."""
    if proxy_is_complete(directory):
        return directory
    tmp = directory.with_name(directory.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    (tmp / "PROXY_COMPLETE").write_text(str(PROXY_VERSION))
    return publish_dir(tmp, directory, proxy_is_complete)
