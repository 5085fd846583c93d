"""Proxy checkpoints of the transformers families: the published routing geometry (layer
count, sparse layers, experts, top-k) at small widths, seeded, routed evenly, written with
`save_pretrained` (safetensors) into a cache directory keyed by a hash of what they depend
on, and loaded from there through `from_pretrained` like a real checkpoint.

Weights: transformers' initialization under the seed, then every matrix redrawn from a
seeded generator as the LLaDA2 proxies are (harness/model/proxy.py `init_weights`): unit
variance embeddings (after the family's embedding scale), 1/sqrt(fan_in) matrices and a
sharper LM head, so positions and context stay visible in the logits. Norms and scales
keep transformers' values. The output projections of the residual branches (attention
o_proj, MLP and expert down_proj) are scaled by 1/sqrt(2 * layers), GPT-2's
initialization: without it 48 random layers average the tokens into their mean (the
variation of Qwen3's router input fell to an effective rank of 8 of 64 by layer 42, and a
quarter of its experts were never routed).

Routing: these routers have no expert bias to calibrate (the LLaDA2 proxies balance theirs
on the corpus). A random router is unbalanced because the router input has a common
component (the corpus mean m): an expert whose row has a large dot product with m wins for
most tokens, and one whose row sees a wider spread of the input wins the top-k more often.
`balance_routers` removes both causes on corpus windows, layer by layer, over a few passes:
each router row loses its component along m (every expert's logit has mean zero on the
corpus) and is rescaled so that every expert's logit has the same spread (the layer's mean
spread). Only the routing matrix changes; the rest of the model stays as drawn.

The tokenizer is the caller's: the LLaDA2 proxies' stdlib BPE tokenizer
(harness.model.proxy.build_tokenizer on the corpus), so prompts encode to the same ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.common.files import fingerprint, publish_dir, write_json_atomic
from harness.families.adapter import FamilyAdapter
from harness.families.geometry import read_family_json
from harness.families.registry import family_adapter, geometry_of

FAMILY_PROXY_VERSION = 2  # 2: residual outputs scaled by 1/sqrt(2 * layers)
MARKER = "PROXY_COMPLETE"
LM_HEAD_GAIN = 6.0  # as the LLaDA2 proxies: confident enough for the decoders' rules
RESIDUAL_OUTPUTS = ("o_proj.weight", "down_proj.weight", "experts.down_proj")  # what a residual branch adds
CALIBRATION_WINDOWS = 8
CALIBRATION_LENGTH = 128
BALANCE_PASSES = 3


# ---- the model --------------------------------------------------------------------------


def token_ids(tokenizer) -> dict[str, int]:
    """The proxy's special ids: end-of-text ends, pads and (for families that want one) begins."""
    eos = int(tokenizer.eos_token_id)
    return {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}


def proxy_config(name: str, vocab_size: int, ids: dict[str, int], overrides: dict[str, Any] | None = None,
                 family_json: dict[str, Any] | None = None) -> dict[str, Any]:
    """The proxy's config.json values (the published config at the proxy's widths); tests
    pass `overrides` for smaller layer counts. `family_json`: the family's stored config
    (read from harness/families/configs/<name>.json when not given)."""
    family_json = family_json if family_json is not None else read_family_json(name)
    if overrides:
        family_json = {**family_json, "proxy": _merged(family_json.get("proxy", {}), overrides)}
    return family_adapter(name, family_json).proxy_config(family_json, vocab_size, ids)


def new_model(adapter: FamilyAdapter, config: dict[str, Any], seed: int) -> nn.Module:
    """A seeded model of `config` with the proxy initialization (module docstring); the
    caller's global generator is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # transformers' own initialization draws from the global generator
        model = adapter.from_config(adapter.hf_config(config), dtype=torch.float32)
    init_proxy_weights(model, seed)
    return model.eval()


def init_proxy_weights(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    embeddings = {id(m.weight): getattr(m, "scalar_embed_scale", 1.0) for m in model.modules()
                  if isinstance(m, nn.Embedding)}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_id = id(head.weight) if head is not None else None
    residual_gain = (2 * model.config.get_text_config().num_hidden_layers) ** -0.5
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda item: item[0]):
            if p.ndim < 2:
                continue  # norms, scales: transformers' values
            if id(p) in embeddings:
                std = 1.0 / embeddings[id(p)]
            else:
                std = (LM_HEAD_GAIN if id(p) == head_id else 1.0) / p.shape[-1] ** 0.5
                std *= residual_gain if name.endswith(RESIDUAL_OUTPUTS) else 1.0
            p.copy_(torch.randn(p.shape, generator=gen) * std)


# ---- routing balance --------------------------------------------------------------------


def calibration_batch(tokenizer, texts: Sequence[str], seed: int) -> torch.Tensor:
    """[windows, length] token windows drawn (seeded) from the texts joined by end-of-text."""
    eos = int(tokenizer.eos_token_id)
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
        ids.append(eos)
        if len(ids) >= 64 * CALIBRATION_LENGTH:
            break
    stream = torch.tensor(ids, dtype=torch.long)
    n_windows = max(1, min(CALIBRATION_WINDOWS, len(stream) // CALIBRATION_LENGTH))
    if len(stream) < CALIBRATION_LENGTH:
        return stream[None, :]
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - CALIBRATION_LENGTH + 1, (n_windows,), generator=gen)
    return torch.stack([stream[s : s + CALIBRATION_LENGTH] for s in starts.tolist()])


def calibration_forward(model: nn.Module, adapter: FamilyAdapter, batch: torch.Tensor) -> None:
    """One forward that routes the batch through every MoE layer (both stacks of a
    diffusion model: the windows' first half as the prompt, the second as a canvas)."""
    with torch.no_grad():
        adapter.forward_batch(model, batch)


def balance_routers(model: nn.Module, adapter: FamilyAdapter, batch: torch.Tensor,
                    passes: int = BALANCE_PASSES) -> list[float]:
    """Center and equalize every router's logits on the batch (module docstring); returns the
    mean over layers of max/mean expert load before the first pass and after each pass."""
    geometry = geometry_of(model)
    sites = adapter.moe_sites(model, geometry)
    linears = {id(adapter.router_linear(s.router)): adapter.router_linear(s.router) for s in sites}
    history = []
    for step in range(passes + 1):
        inputs: dict[int, list[torch.Tensor]] = {key: [] for key in linears}
        loads: list[torch.Tensor] = []
        hooks = [lin.register_forward_pre_hook(_collect(inputs[key])) for key, lin in linears.items()]
        hooks += [s.experts.register_forward_pre_hook(_count(loads, geometry.num_experts)) for s in sites]
        try:
            calibration_forward(model, adapter, batch)
        finally:
            for hook in hooks:
                hook.remove()
        history.append(_imbalance(loads))
        if step < passes:
            for key, lin in linears.items():
                _center_and_equalize(lin.weight, torch.cat(inputs[key]))
    return history


def _center_and_equalize(weight: torch.Tensor, x: torch.Tensor) -> None:
    x = x.reshape(-1, x.shape[-1]).double()
    mean = x.mean(0)
    with torch.no_grad():
        w = weight.double()
        w = w - (w @ mean)[:, None] * mean[None, :] / mean.dot(mean).clamp(min=1e-30)
        spread = ((x - mean) @ w.T).std(0).clamp(min=1e-12)  # [E]
        weight.copy_((w * (spread.mean() / spread)[:, None]).to(weight.dtype))


def _collect(store: list[torch.Tensor]):
    def hook(module: nn.Module, args: tuple) -> None:
        store.append(args[0].detach().reshape(-1, args[0].shape[-1]))

    return hook


def _count(store: list[torch.Tensor], n_experts: int):
    def hook(module: nn.Module, args: tuple) -> None:
        store.append(torch.bincount(args[1].reshape(-1), minlength=n_experts))

    return hook


def _imbalance(loads: list[torch.Tensor]) -> float:
    """Mean over layers (and stacks) of the heaviest expert's load over the mean load."""
    ratios = [float(load.max()) / max(float(load.float().mean()), 1e-12) for load in loads]
    return sum(ratios) / max(len(ratios), 1)


# ---- the cache ------------------------------------------------------------------------


def proxy_key(config: dict[str, Any], seed: int, tokenizer, texts: Sequence[str]) -> str:
    """What a proxy depends on: its config, seed, the tokenizer, the calibration texts and
    this module's version."""
    texts_digest = hashlib.sha256("\0".join(texts[:64]).encode()).hexdigest()
    tokenizer_digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    return fingerprint({"config": config, "seed": seed, "version": FAMILY_PROXY_VERSION,
                        "tokenizer": tokenizer_digest, "texts": texts_digest})


def build_proxy(name: str, seed: int, cache_dir: str | Path, tokenizer, texts: Sequence[str],
                overrides: dict[str, Any] | None = None, family_json: dict[str, Any] | None = None) -> Path:
    """The cached proxy checkpoint of family `name`, written on first use (see the module
    docstring); `texts` are the calibration texts (the stdlib corpus), `overrides` change
    the proxy config (tests), `family_json` is the family's stored config (its entry's;
    read from harness/families/configs/<name>.json when not given)."""
    adapter = family_adapter(name, family_json)
    config = proxy_config(name, len(tokenizer), token_ids(tokenizer), overrides, family_json)
    directory = Path(cache_dir) / f"family-{name}-seed{seed}-{proxy_key(config, seed, tokenizer, texts)}"
    if _complete(directory):
        return directory
    tmp = directory.with_name(directory.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = new_model(adapter, config, seed)
    history = balance_routers(model, adapter, calibration_batch(tokenizer, texts, seed))
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    write_json_atomic(tmp / "proxy.json", {"family": name, "seed": seed, "version": FAMILY_PROXY_VERSION,
                                           "imbalance_per_pass": history, "config": config})
    (tmp / MARKER).write_text(str(FAMILY_PROXY_VERSION))
    publish_dir(tmp, directory, _complete)
    return directory


def _complete(directory: Path) -> bool:
    marker = directory / MARKER
    return marker.exists() and marker.read_text().strip() == str(FAMILY_PROXY_VERSION)


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(base))
    for key, value in overrides.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
