"""Routing files the importer tests write themselves (no third-party data is committed): a
tiny MoE config.json, random routing for it, and that routing written in every format the
importer reads (harness/traces/vllm_format.py, ids_format.py, jsonl_format.py)."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# DeepSeek-V3's shape, tiny: 1 dense layer then 3 MoE layers of 16 experts, top-4, a shared
# expert, multi-head latent attention
TINY_DEEPSEEK = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 4, "first_k_dense_replace": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 16, "n_shared_experts": 1,
    "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1, "kv_lora_rank": 8, "q_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "max_position_embeddings": 512,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
LAYERS, EXPERTS, TOP_K = 3, 16, 4


def write_config(directory: Path, config: dict[str, Any] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(config or TINY_DEEPSEEK))
    return path


@dataclass
class Routing:
    """One request: its prompt's rows [P, L, k] and its generated rows [G - 1, L, k]."""

    prompt: np.ndarray
    generated: np.ndarray

    @property
    def tokens(self) -> int:  # generated tokens: every generated row is fed back, plus the last token
        return len(self.generated) + 1


def random_routing(n_requests: int, seed: int = 0, prompt: int = 5, generated: int = 7, sticky: float = 0.0,
                   layers: int = LAYERS, experts: int = EXPERTS, top_k: int = TOP_K) -> list[Routing]:
    """Distinct top-k per token; with `sticky` > 0 a token keeps each previous expert with
    that probability (temporal locality)."""
    rng = np.random.default_rng(seed)

    def rows(n: int) -> np.ndarray:
        out = np.zeros((n, layers, top_k), dtype=np.int64)
        for t in range(n):
            for layer in range(layers):
                keep = [e for e in out[t - 1, layer] if rng.random() < sticky] if t else []
                rest = rng.permutation([e for e in range(experts) if e not in keep])[:top_k - len(keep)]
                out[t, layer] = sorted([*keep, *rest])
        return out

    return [Routing(rows(prompt + r), rows(generated + r - 1)) for r in range(n_requests)]


def b64_npy(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array.astype(np.uint8), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def completion(routing: Routing, rid: str, created: int, layout: str = "split") -> dict[str, Any]:
    """A /v1/completions response of vLLM with return_token_ids=true."""
    choice: dict[str, Any] = {"index": 0, "text": "", "token_ids": list(range(routing.tokens)),
                              "prompt_token_ids": list(range(len(routing.prompt)))}
    response: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": "tiny",
                                "choices": [choice]}
    if layout == "split":
        response["prompt_routed_experts"] = routing.prompt.tolist()
        choice["routed_experts"] = routing.generated.tolist()
    else:
        choice["routed_experts"] = b64_npy(np.concatenate([routing.prompt, routing.generated]))
    return response


def chat(routings: list[Routing], rid: str, created: int) -> dict[str, Any]:
    """A /v1/chat/completions response with n = len(routings) choices sharing one prompt."""
    prompt = routings[0].prompt
    return {"id": rid, "object": "chat.completion", "created": created, "model": "tiny",
            "prompt_token_ids": list(range(len(prompt))), "prompt_routed_experts": prompt.tolist(),
            "choices": [{"index": i, "message": {"role": "assistant", "content": ""},
                         "token_ids": list(range(r.tokens)), "routed_experts": r.generated.tolist()}
                        for i, r in enumerate(routings)],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": sum(r.tokens for r in routings)}}


def write_vllm(path: Path, routings: list[Routing], layout: str = "split") -> Path:
    lines = [json.dumps(completion(r, f"cmpl-{i}", 1000 + i, layout)) for i, r in enumerate(routings)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_vllm_arrays(directory: Path, routings: list[Routing]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(routings):
        np.savez(directory / f"request_{i:03d}.npz", prompt_routed_experts=r.prompt.astype(np.int16),
                 routed_experts=r.generated.astype(np.int16), prompt_token_ids=np.arange(len(r.prompt)),
                 token_ids=np.arange(r.tokens))
    return directory


def write_ids(path: Path, routings: list[Routing], weights: bool = False) -> Path:
    rows = [np.concatenate([r.prompt, r.generated]) for r in routings]
    arrays = {"expert_ids": np.concatenate(rows).astype(np.int32),
              "request_lengths": np.array([len(x) for x in rows]),
              "prompt_lengths": np.array([len(r.prompt) for r in routings]),
              "generated_lengths": np.array([r.tokens for r in routings])}
    if weights:
        arrays["gate_weights"] = np.full(arrays["expert_ids"].shape, 1 / TOP_K, dtype=np.float32)
    np.savez(path, **arrays)
    return path


def write_parquet(path: Path, routings: list[Routing]) -> Path:
    import pandas as pd

    frame = pd.DataFrame({"request": [f"r{i}" for i in range(len(routings))],
                          "expert_ids": [np.concatenate([r.prompt, r.generated]).tolist() for r in routings],
                          "prompt_tokens": [len(r.prompt) for r in routings],
                          "generated_tokens": [r.tokens for r in routings]})
    frame.to_parquet(path)
    return path


def jsonl_rows(routings: list[Routing], names: dict[str, str] | None = None, layer_offset: int = 0
               ) -> list[dict[str, Any]]:
    """One row per (request, layer, token), shuffled-free but in layer-major order (loggers
    write per layer), field names renamed by `names`."""
    names = names or {}
    rows = []
    for i, r in enumerate(routings):
        ids = np.concatenate([r.prompt, r.generated])
        for layer in range(ids.shape[1]):
            for t in range(len(ids)):
                row = {"request": f"req-{i}", "layer": layer + layer_offset, "token": t,
                       "experts": ids[t, layer].tolist(), "phase": "prefill" if t < len(r.prompt) else "decode"}
                rows.append({names.get(k, k): v for k, v in row.items()})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
