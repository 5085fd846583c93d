"""A harness-recorded autoregressive trace written as vLLM's saved responses (one completions
response per prompt, one per line), so the importer can be checked against the harness's own
recording: export, import, replay both, every counter equal (tests/integration/test_real_routing.py).

  layout=split     response["prompt_routed_experts"] and choice["routed_experts"] as JSON lists
  layout=combined  choice["routed_experts"] alone, base64 of an .npy of the prompt's and the
                   generated tokens' rows (num_tokens - 1), as vLLM's current server sends it

A trace holds per-forward loads, not per-token ids: a decode forward's k experts are its
one token's (ascending ids; the router's order is not recorded), and the prefill's loads
are dealt to its P tokens, each k distinct experts (any assignment with those loads replays
identically, since a replay sees only loads). Token texts and ids are not recorded: the
responses carry usage's counts instead. Next-layer hints cannot be written (vLLM has none).
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.errors import HarnessError
from harness.common.files import write_atomic
from harness.placement.trace import RoutingTrace
from harness.traces.serving import PER_PROMPT_TOKENS, is_autoregressive, prompt_rows

LAYOUTS = ("split", "combined")


def deal(loads: np.ndarray, n_tokens: int, top_k: int, where: str) -> np.ndarray:
    """int [n_tokens, L, k]: each token k distinct experts, the experts' counts as `loads`
    [L, E] says (each expert's copies fill consecutive slots of a column-major n x k grid,
    so no token gets one expert twice: a count never exceeds n_tokens)."""
    out = np.zeros((n_tokens, loads.shape[0], top_k), dtype=np.int64)
    for layer, row in enumerate(loads):
        if int(row.sum()) != n_tokens * top_k or int(row.max(initial=0)) > n_tokens:
            raise HarnessError(f"{where} layer {layer}: loads {int(row.sum())} pairs for {n_tokens} tokens x top-"
                               f"{top_k}: not an autoregressive recording with top-k routing; it cannot be exported")
        flat = np.repeat(np.arange(len(row)), row)
        out[:, layer, :] = flat.reshape(top_k, n_tokens).T
    return out


def request_ids(trace: RoutingTrace, rows: list[int], top_k: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(prompt ids [P, L, k], generated ids [G - 1, L, k]) of one prompt's forwards."""
    loads = trace.loads.numpy()
    prefill = rows[0]
    prompt = deal(loads[prefill], trace.forward_size(prefill, top_k)[0], top_k, f"{where} prefill")
    generated = [deal(loads[r], 1, top_k, f"{where} forward {r}")[0] for r in rows[1:]]
    shape = (0, trace.n_layers, top_k)
    return prompt, np.stack(generated) if generated else np.zeros(shape, dtype=np.int64)


def responses(trace: RoutingTrace, layout: str = "split") -> list[dict[str, Any]]:
    if layout not in LAYOUTS:
        raise HarnessError(f"layout={layout!r} is not allowed; use split or combined")
    top_k = trace.geometry.get("num_experts_per_tok")
    if not isinstance(top_k, int) or top_k < 1:
        raise HarnessError("the trace records no top-k in its geometry; record it again with this harness")
    counts = trace.meta.get(PER_PROMPT_TOKENS)
    out = []
    for p, rows in enumerate(prompt_rows(trace)):
        where = f"prompt {trace.steps[rows[0]].prompt}"
        if not is_autoregressive(trace, rows):
            raise HarnessError(f"{where} is not a prefill followed by decode forwards: only an autoregressive "
                               "recording exports to vLLM's format")
        g = counts[p] if isinstance(counts, list) and p < len(counts) else len(rows)
        if g != len(rows):
            raise HarnessError(f"{where}: {g} generated tokens but {len(rows) - 1} decode forwards; the trace's meta "
                               "disagrees with its forwards")
        prompt, generated = request_ids(trace, rows, top_k, where)
        dtype = np.uint8 if trace.n_experts <= 256 else np.uint16  # as vLLM narrows its ids
        choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": "length", "token_ids": None}
        response: dict[str, Any] = {"id": f"cmpl-harness-{p}", "object": "text_completion", "created": p,
                                    "model": str(trace.meta.get("model", "?")), "choices": [choice],
                                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": g,
                                              "total_tokens": len(prompt) + g}}
        if layout == "split":
            response["prompt_routed_experts"] = prompt.tolist()
            choice["routed_experts"] = generated.tolist()
        else:
            buffer = io.BytesIO()
            np.save(buffer, np.concatenate([prompt, generated]).astype(dtype), allow_pickle=False)
            choice["routed_experts"] = base64.b64encode(buffer.getvalue()).decode()
        out.append(response)
    return out


def export_vllm(trace: RoutingTrace, path: str | Path, layout: str = "split") -> Path:
    """The responses as JSON lines at `path` (written whole or not at all)."""
    lines = "".join(json.dumps(r) + "\n" for r in responses(trace, layout))
    return write_atomic(path, lambda f: f.write(lines.encode()))
