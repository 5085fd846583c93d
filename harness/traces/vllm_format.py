"""vLLM's routed experts (a server started with `--enable-return-routed-experts`), as saved
responses of its OpenAI-compatible server or as numpy arrays per request
(docs/real-routing.md cites the fields):

  responses (.json: one response or a list; .jsonl: one per line, or {"response": ...})
      /v1/completions and /v1/chat/completions, n >= 1 choices each. Two layouts, as vLLM
      releases wrote them:
        split     response["prompt_routed_experts"] [prompt_len, L, k] (shared by the choices)
                  and choice["routed_experts"] [gen_len - 1, L, k], JSON lists
        combined  choice["routed_experts"] alone: base64 of an .npy of [num_tokens - 1, L, k]
                  (np.load(io.BytesIO(base64.b64decode(s)))), the prompt's rows first
      token counts: the prompt's from `prompt_token_ids` (chat: the response's; completions:
      the choice's) or usage.prompt_tokens; a choice's generated tokens from its `token_ids`
      (return_token_ids=true) or, with one choice, usage.completion_tokens
  arrays (.npz, one request each): `prompt_routed_experts`, `routed_experts` as above
      (split), optional `prompt_token_ids` and `token_ids` for the counts

Every choice is one request (its own prefill: a server without prefix caching); responses
arrive in the order of their `created` time, then of the files (sorted by name) and lines.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.errors import HarnessError
from harness.traces.importing import Imported, Request, as_ids

SUFFIXES = (".json", ".jsonl", ".npz")


def read_vllm(path: Path) -> Imported:
    files = input_files(path, SUFFIXES, "saved vLLM responses (.json, .jsonl) or per-request arrays (.npz)")
    requests: list[Request] = []
    seen: dict[tuple[str, int], str] = {}
    layouts: set[str] = set()
    for file in files:
        if file.suffix == ".npz":
            requests.append(_npz_request(file, len(requests)))
            layouts.add("arrays")
            continue
        for where, response in _responses(file):
            for request, key, layout in _choices(response, where):
                if key is not None and key in seen:
                    raise HarnessError(f"{where}: response {key[0]} choice {key[1]} appears twice (first at "
                                       f"{seen[key]}): a duplicate; save each response once")
                if key is not None:
                    seen[key] = where
                layouts.add(layout)
                requests.append(request)
    return Imported(requests, {"format": "vllm", "path": str(path), "files": [f.name for f in files],
                               "layout": sorted(layouts)})


def input_files(path: Path, suffixes: tuple[str, ...], what: str) -> list[Path]:
    """The file, or a directory's files with one of `suffixes`, sorted by name."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in suffixes)
        if not files:
            raise HarnessError(f"{path} holds no {' / '.join(suffixes)} file; give {what}")
        return files
    if not path.is_file():
        raise HarnessError(f"in={path} does not exist; give {what}")
    if path.suffix not in suffixes:
        raise HarnessError(f"in={path} is not a {' / '.join(suffixes)} file; give {what}")
    return [path]


def _responses(file: Path) -> list[tuple[str, Any]]:
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"cannot read {file} ({exc}); give saved vLLM responses") from None
    out: list[tuple[str, Any]] = []
    if file.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                out.append((f"{file.name}:{number}", _json(line, f"{file.name}:{number}")))
    else:
        value = _json(text, file.name)
        items = value if isinstance(value, list) else [value]
        out = [(f"{file.name}[{i}]" if isinstance(value, list) else file.name, v) for i, v in enumerate(items)]
    return [(where, v.get("response", v) if isinstance(v, dict) else v) for where, v in out]


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise HarnessError(f"{where} is not JSON ({exc.args[0][:80]}); save each response as the server "
                           "returned it") from None


def _choices(response: Any, where: str) -> list[tuple[Request, tuple[str, int] | None, str]]:
    if not isinstance(response, dict) or not isinstance(response.get("choices"), list) or not response["choices"]:
        raise HarnessError(f"{where} is not a completions or chat completions response (no choices)")
    if str(response.get("object", "")).endswith(".chunk"):
        raise HarnessError(f"{where} is a streamed chunk, which carries no routing; save non-streamed responses "
                           "(stream=false)")
    rid = response.get("id")
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    shared_prompt = response.get("prompt_routed_experts")
    out = []
    for i, choice in enumerate(response["choices"]):
        if not isinstance(choice, dict):
            raise HarnessError(f"{where}: choice {i} is not an object")
        index = choice.get("index", i)
        name = f"{where} response {rid or '?'} choice {index}"
        routes = choice.get("routed_experts")
        if routes is None:
            raise HarnessError(f"{name} has no routed_experts: start vLLM with --enable-return-routed-experts (an "
                               "aborted request has none either)")
        rows = _ids(routes, f"{name} routed_experts")
        p = _count(choice.get("prompt_token_ids", response.get("prompt_token_ids")), usage.get("prompt_tokens"))
        token_ids = choice.get("token_ids")
        g = len(token_ids) if isinstance(token_ids, list) else \
            (_int(usage.get("completion_tokens")) if len(response["choices"]) == 1 else None)
        if g is None:
            raise HarnessError(f"{name}: no token_ids and n={len(response['choices'])} choices share usage's token "
                               "count; send the requests with return_token_ids=true")
        if shared_prompt is not None:
            prompt, layout = _ids(shared_prompt, f"{where} prompt_routed_experts"), "split"
            generated = rows
        else:
            prompt, generated, layout = _split(rows, p, g, name)
        created = response.get("created")
        arrival = float(created) if isinstance(created, int | float) and not isinstance(created, bool) else 0.0
        request = Request(name, prompt, generated, g, p, arrival)
        out.append((request, (str(rid), int(index)) if rid is not None else None, layout))
    return out


def _split(rows: np.ndarray, p: int | None, g: int, name: str) -> tuple[np.ndarray, np.ndarray, str]:
    """The combined layout: the prompt's rows first, then the generated tokens' rows."""
    if p is None:
        raise HarnessError(f"{name}: routed_experts holds prompt and generated rows together but the response gives "
                           "no prompt length (prompt_token_ids or usage.prompt_tokens); save the whole response")
    if len(rows) in (p + g - 1, p + g):
        return rows[:p], rows[p:], "combined"
    if len(rows) in (g - 1, g):
        raise HarnessError(f"{name}: routed_experts holds only the generated tokens' {len(rows)} rows and the "
                           "response has no prompt_routed_experts: the prompt's routing is missing")
    raise HarnessError(f"{name}: routed_experts holds {len(rows)} rows but {p} prompt + {g} generated tokens need "
                       f"{p + g - 1} (every token but the last): tokens were "
                       f"{'dropped' if len(rows) < p + g - 1 else 'duplicated or added'}")


def _ids(value: Any, what: str) -> np.ndarray:
    if isinstance(value, str):  # base64 of an .npy (vLLM's compact wire format)
        try:
            value = np.load(io.BytesIO(base64.b64decode(value, validate=True)), allow_pickle=False)
        except (binascii.Error, ValueError, OSError, EOFError) as exc:
            raise HarnessError(f"{what} is a string but not base64 of an .npy array ({type(exc).__name__}); save "
                               "the response as the server returned it") from None
    return as_ids(value, what)


def _count(ids: Any, usage_count: Any) -> int | None:
    return len(ids) if isinstance(ids, list) else _int(usage_count)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _npz_request(file: Path, order: int) -> Request:
    try:
        with np.load(file, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise HarnessError(f"{file} is not an .npz of routed expert arrays ({type(exc).__name__})") from None
    if "routed_experts" not in arrays:
        raise HarnessError(f"{file} has no routed_experts array; save vLLM's prompt_routed_experts and routed_experts "
                           "per request")
    generated = as_ids(arrays["routed_experts"], f"{file.name} routed_experts")
    prompt = as_ids(arrays["prompt_routed_experts"], f"{file.name} prompt_routed_experts") \
        if "prompt_routed_experts" in arrays else None
    if prompt is None:
        raise HarnessError(f"{file.name} has no prompt_routed_experts: the prompt's routing is missing")
    p = len(arrays["prompt_token_ids"]) if "prompt_token_ids" in arrays else None
    g = len(arrays["token_ids"]) if "token_ids" in arrays else None
    return Request(f"{file.name}", prompt, generated, g, p, float(order))
