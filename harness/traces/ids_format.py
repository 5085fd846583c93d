"""A generic dump of routed expert ids per request, as public routing data sets and one-off
recorders write them (docs/real-routing.md):

  .npz      expert_ids        int [N, L, k]   every request's token rows, one after another
            request_lengths   int [R]         rows per request (sum N; absent: one request)
            prompt_lengths    int [R]         optional: the first rows of each that are its prompt
            generated_lengths int [R]         optional: generated tokens (checks for dropped rows)
            gate_weights      float [N, L, k] optional: checked, not replayed (loads are counts)
            request_names     str [R]         optional: names in messages (each once)
            arrival           float [R]       optional: arrival order (default: file order)
  .parquet  one row per request: `expert_ids` (nested [tokens][layers][k]) and the optional
            `request`, `prompt_tokens`, `generated_tokens`, `gate_weights`, `arrival`

With a prompt split a request is a prefill over its prompt rows and a decode forward per
further row (G = rows - P + 1 generated tokens, or generated_lengths with its last row
allowed); without one, every row is one decode forward (a teacher-forced dump replayed
token by token).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.errors import HarnessError
from harness.traces.importing import Imported, Request, as_ids
from harness.traces.vllm_format import input_files

SUFFIXES = (".npz", ".parquet")


def read_ids(path: Path) -> Imported:
    files = input_files(path, SUFFIXES, "an expert-id dump (.npz or .parquet, docs/real-routing.md)")
    requests: list[Request] = []
    for file in files:
        requests += _npz(file) if file.suffix == ".npz" else _parquet(file)
    _no_duplicates(requests)
    for order, request in enumerate(requests):  # arrival: as given, else the order read
        request.arrival = request.arrival if request.arrival == request.arrival else float(order)
    return Imported(requests, {"format": "ids", "path": str(path), "files": [f.name for f in files]})


def _npz(file: Path) -> list[Request]:
    try:
        with np.load(file, allow_pickle=False) as z:
            a = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise HarnessError(f"{file} is not an .npz of expert ids ({type(exc).__name__})") from None
    if "expert_ids" not in a:
        raise HarnessError(f"{file} has no expert_ids array [tokens, MoE layers, top_k]; see docs/real-routing.md")
    ids = as_ids(a["expert_ids"], f"{file.name} expert_ids")
    lengths = _column(a, "request_lengths", file, [len(ids)])
    n = len(lengths)
    if any(v < 0 for v in lengths) or sum(lengths) != len(ids):
        raise HarnessError(f"{file.name}: request_lengths add up to {sum(lengths)} rows but expert_ids holds "
                           f"{len(ids)}: rows were dropped or added")
    prompts = _column(a, "prompt_lengths", file, None, n)
    generated = _column(a, "generated_lengths", file, None, n)
    weights = a.get("gate_weights")
    if weights is not None and weights.shape != ids.shape:
        raise HarnessError(f"{file.name}: gate_weights {weights.shape} must be shaped like expert_ids {ids.shape}")
    names = [str(v) for v in a["request_names"]] if "request_names" in a else \
        [f"{file.name} request {r}" for r in range(n)]
    if len(names) != n:
        raise HarnessError(f"{file.name}: request_names lists {len(names)} names for {n} requests")
    arrival = a["arrival"].astype(float).tolist() if "arrival" in a else [float("nan")] * n
    out, start = [], 0
    for r in range(n):
        rows = slice(start, start + lengths[r])
        start += lengths[r]
        w = None if weights is None else weights[rows]
        out.append(_request(names[r], ids[rows], None if prompts is None else prompts[r],
                            None if generated is None else generated[r], w, arrival[r]))
    return out


def _column(arrays: dict[str, np.ndarray], key: str, file: Path, default: list[int] | None,
            n: int | None = None) -> list[int] | None:
    if key not in arrays:
        return default
    value = arrays[key]
    if value.ndim != 1 or value.dtype.kind not in "iu" or (n is not None and len(value) != n):
        raise HarnessError(f"{file.name}: {key} must be one integer per request ({n or 'any'}), got "
                           f"{value.dtype} {value.shape}")
    return [int(v) for v in value]


def _request(name: str, ids: np.ndarray, prompt: int | None, generated: int | None, weights: np.ndarray | None,
             arrival: float) -> Request:
    if prompt is None:
        return Request(name, None, ids, generated, None, arrival, [] if weights is None else [weights])
    if not 0 < prompt <= len(ids):
        raise HarnessError(f"{name}: its prompt is {prompt} tokens but it holds {len(ids)} rows; prompt tokens were "
                           "dropped (or prompt_lengths is wrong)")
    split = [] if weights is None else [weights[:prompt], weights[prompt:]]
    return Request(name, ids[:prompt], ids[prompt:], generated, prompt, arrival, split)


def _parquet(file: Path) -> list[Request]:
    import pandas as pd

    try:
        frame = pd.read_parquet(file)
    except Exception as exc:  # pyarrow's errors are many; any of them means an unreadable file
        raise HarnessError(f"{file} is not a readable parquet file ({type(exc).__name__})") from None
    if "expert_ids" not in frame.columns:
        raise HarnessError(f"{file.name} has no expert_ids column (one [tokens][layers][top_k] list per request)")
    out = []
    for r, row in enumerate(frame.to_dict("records")):
        name = f"{file.name} request {row['request']}" if "request" in row else f"{file.name} row {r}"
        ids = as_ids(_nested(row["expert_ids"]), f"{name} expert_ids")
        weights = np.asarray(_nested(row["gate_weights"]), dtype=float) if row.get("gate_weights") is not None \
            else None
        arrival = float(row["arrival"]) if row.get("arrival") is not None else float("nan")
        out.append(_request(name, ids, _opt_int(row.get("prompt_tokens"), name, "prompt_tokens"),
                            _opt_int(row.get("generated_tokens"), name, "generated_tokens"), weights, arrival))
    return out


def _nested(value: Any) -> Any:
    """pyarrow's nested lists arrive as object arrays of arrays: back to plain lists."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [_nested(v) for v in value]
    return value.tolist() if isinstance(value, np.ndarray) else value


def _opt_int(value: Any, name: str, key: str) -> int | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise HarnessError(f"{name}: {key}={value!r} must be a whole number")
    return int(value)


def _no_duplicates(requests: list[Request]) -> None:
    first: dict[str, int] = {}
    for i, request in enumerate(requests):
        if request.name in first:
            raise HarnessError(f"{request.name} appears twice (requests {first[request.name]} and {i}): a duplicate; "
                               "give each request once")
        first[request.name] = i
