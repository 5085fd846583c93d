"""One JSON row per (request, layer, token) with the token's expert list, as logging patches
of vLLM and SGLang write them (docs/real-routing.md). Field names are mapped by option:

  fields=request:<name>,layer:<name>,token:<name>,experts:<name>[,weights:<name>][,phase:<name>]

(defaults: request, layer, token, experts, weights, phase). `token` is the token's position
in its request (prompt first); `layer` the MoE layer (layers=moe, the default) or the
decoder layer (layers=decoder: mapped through the model's sparse layers); `phase` (if the
rows have it) says prompt or generated: prefill / prompt / true / 1 against decode /
generated / false / 0. Without a phase, every token is one decode forward.

Every request must hold each token 0..T-1 at every MoE layer once: a missing one is a
dropped token, a repeated one a duplicate, each named with its request, layer and token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.errors import HarnessError
from harness.placement.system import MoEGeometry
from harness.traces.importing import Imported, Request, as_ids
from harness.traces.vllm_format import input_files

FIELDS = ("request", "layer", "token", "experts", "weights", "phase")
REQUIRED = ("request", "layer", "token", "experts")
PROMPT_PHASES = ("prefill", "prompt", "true", "1")
GENERATED_PHASES = ("decode", "generated", "false", "0")
LAYER_INDICES = ("moe", "decoder")


def field_names(spec: str | None) -> dict[str, str]:
    """`fields=request:rid,layer:l,...` as {field: column}; unnamed fields keep their names."""
    names = {f: f for f in FIELDS}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        key, sep, column = part.partition(":")
        if not sep or key.strip() not in FIELDS or not column.strip():
            raise HarnessError(f"fields={spec!r}: {part!r} must be <field>:<column name> with a field among "
                               f"{', '.join(FIELDS)}")
        names[key.strip()] = column.strip()
    return names


@dataclass
class _Request:
    first_line: int
    rows: dict[tuple[int, int], tuple[list[int], Any, int]] = field(default_factory=dict)  # (token, layer)
    phase: dict[int, bool] = field(default_factory=dict)  # token -> prompt?


def read_jsonl(path: Path, geometry: MoEGeometry, fields: str | None = None, layers: str = "moe") -> Imported:
    if layers not in LAYER_INDICES:
        raise HarnessError(f"layers={layers!r} is not allowed; use moe (MoE-layer index) or decoder (decoder layer)")
    names = field_names(fields)
    files = input_files(path, (".jsonl",), "one JSON row per (request, layer, token) (.jsonl)")
    requests: dict[str, _Request] = {}
    for file in files:
        for number, line in enumerate(file.read_text().splitlines(), 1):
            if line.strip():
                _add_row(requests, _row(line, f"{file.name}:{number}", names), f"{file.name}:{number}", number,
                         geometry, layers)
    out = [_assemble(key, req, geometry) for key, req in sorted(requests.items(), key=lambda kv: kv[1].first_line)]
    for order, request in enumerate(out):
        request.arrival = float(order)
    return Imported(out, {"format": "jsonl", "path": str(path), "files": [f.name for f in files],
                          "fields": names, "layers": layers})


def _row(line: str, where: str, names: dict[str, str]) -> dict[str, Any]:
    try:
        raw = json.loads(line)
    except ValueError:
        raise HarnessError(f"{where} is not a JSON object; give one row per (request, layer, token)") from None
    if not isinstance(raw, dict):
        raise HarnessError(f"{where} is not a JSON object; give one row per (request, layer, token)")
    missing = [names[f] for f in REQUIRED if names[f] not in raw]
    if missing:
        raise HarnessError(f"{where} has no {', '.join(missing)}; map the row's field names with "
                           "fields=request:<name>,layer:<name>,token:<name>,experts:<name>")
    return {f: raw.get(names[f]) for f in FIELDS}


def _add_row(requests: dict[str, _Request], row: dict[str, Any], where: str, number: int, geometry: MoEGeometry,
             layers: str) -> None:
    key = str(row["request"])
    layer, token = row["layer"], row["token"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (layer, token)):
        raise HarnessError(f"{where}: layer={layer!r} and token={token!r} must be whole numbers >= 0")
    if layers == "decoder":
        sparse = getattr(geometry, "sparse_layers", None) or range(geometry.first_k_dense_replace,
                                                                   geometry.num_hidden_layers)
        if layer not in sparse:
            raise HarnessError(f"{where}: decoder layer {layer} has no routed experts in the model's config (its MoE "
                               f"layers are {list(sparse)[:3]}...{list(sparse)[-1]})")
        layer = list(sparse).index(layer)
    if layer >= geometry.n_moe_layers:
        raise HarnessError(f"{where}: MoE layer {layer} but the model's config has {geometry.n_moe_layers}: the layer "
                           "count does not match (decoder-layer indices? add layers=decoder)")
    experts, k = row["experts"], geometry.num_experts_per_tok
    if not isinstance(experts, list) or len(experts) != k:
        raise HarnessError(f"{where}: request {key} token {token} layer {layer} lists {experts!r} but the model routes "
                           f"top-{k}: give its {k} expert ids")
    request = requests.setdefault(key, _Request(number))
    if (token, layer) in request.rows:
        raise HarnessError(f"{where}: request {key} token {token} layer {layer} is a duplicate of line "
                           f"{request.rows[(token, layer)][2]}")
    request.rows[(token, layer)] = (row["experts"], row["weights"], number)
    if row["phase"] is not None:
        prompt = _phase(row["phase"], where)
        if request.phase.setdefault(token, prompt) != prompt:
            raise HarnessError(f"{where}: request {key} token {token} is marked prompt on one layer and generated on "
                               "another")


def _phase(value: Any, where: str) -> bool:
    text = str(value).lower()
    if text in PROMPT_PHASES or text in GENERATED_PHASES:
        return text in PROMPT_PHASES
    raise HarnessError(f"{where}: phase={value!r} is neither prompt ({', '.join(PROMPT_PHASES)}) nor generated "
                       f"({', '.join(GENERATED_PHASES)})")


def _assemble(key: str, req: _Request, geometry: MoEGeometry) -> Request:
    name = f"request {key}"
    n_layers = geometry.n_moe_layers
    tokens = sorted({t for t, _ in req.rows})
    for expected, token in enumerate(tokens):
        if token != expected:
            raise HarnessError(f"{name} has no row for token {expected} (its rows jump to token {token}): a dropped "
                               "token")
    for token in tokens:
        for layer in range(n_layers):
            if (token, layer) not in req.rows:
                raise HarnessError(f"{name} token {token} has no row for MoE layer {layer}: a dropped row")
    ids = as_ids([[req.rows[(t, la)][0] for la in range(n_layers)] for t in tokens], f"{name}'s experts")
    weights = [[req.rows[(t, la)][1] for la in range(n_layers)] for t in tokens]
    w = None if any(v is None for row in weights for v in row) else np.asarray(weights, dtype=float)
    if not req.phase:
        return Request(name, None, ids, None, None, 0.0, [] if w is None else [w])
    prompt = [t for t in tokens if req.phase.get(t, False)]
    if prompt != list(range(len(prompt))):
        raise HarnessError(f"{name}: its prompt tokens {prompt[:4]}... are not its first tokens")
    p = len(prompt)
    if p == 0:
        return Request(name, None, ids, None, None, 0.0, [] if w is None else [w])
    split = [] if w is None else [w[:p], w[p:]]
    return Request(name, ids[:p], ids[p:], None, p, 0.0, split)
