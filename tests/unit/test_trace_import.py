"""Importing routing recorded elsewhere (harness/traces/importing.py and its format readers):
the same routing written in every format imports to the same trace, the trace has the
forwards an autoregressive decode runs, and every malformed file is one line naming the
request and the position, exit code 2 (docs/real-routing.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from harness.common.errors import HarnessError, exit_with
from harness.placement.trace import RoutingTrace
from harness.traces.__main__ import main
from tests.routing_files import (
    EXPERTS,
    LAYERS,
    TOP_K,
    b64_npy,
    chat,
    completion,
    jsonl_rows,
    random_routing,
    write_config,
    write_ids,
    write_jsonl,
    write_parquet,
    write_vllm,
    write_vllm_arrays,
)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "model")


def imported(fmt: str, source: Path, config: Path, out: Path, *extra: str) -> RoutingTrace:
    assert main(["import", f"format={fmt}", f"in={source}", "model=hf", f"config={config}", f"out={out}",
                 *extra]) == 0
    return RoutingTrace.load(out)


def test_the_same_routing_imports_to_the_same_trace_in_every_format(config: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    routings = random_routing(3, seed=1)
    files = {
        "vllm split": ("vllm", write_vllm(tmp_path / "split.jsonl", routings)),
        "vllm combined": ("vllm", write_vllm(tmp_path / "combined.jsonl", routings, layout="combined")),
        "vllm arrays": ("vllm", write_vllm_arrays(tmp_path / "arrays", routings)),
        "ids npz": ("ids", write_ids(tmp_path / "ids.npz", routings, weights=True)),
        "ids parquet": ("ids", write_parquet(tmp_path / "ids.parquet", routings)),
        "jsonl": ("jsonl", write_jsonl(tmp_path / "rows.jsonl", jsonl_rows(routings))),
    }
    traces = {name: imported(fmt, path, config, tmp_path / f"{name}.npz") for name, (fmt, path) in files.items()}
    reference = traces["vllm split"]
    for name, trace in traces.items():
        assert trace.loads.equal(reference.loads), name
        assert trace.steps == reference.steps and trace.n_tokens == reference.n_tokens, name
        assert trace.n_context == reference.n_context, name
        for key in ("prompts", "generated_tokens", "decode_steps", "generated_per_prompt", "routing"):
            assert trace.meta[key] == reference.meta[key], (name, key)
    assert capsys.readouterr().out.count("temporal_locality") == len(files)  # every import prints its statistics


def test_an_import_has_the_forwards_of_an_autoregressive_decode(config: Path, tmp_path: Path) -> None:
    routings = random_routing(2, seed=2, prompt=5, generated=9)
    trace = imported("vllm", write_vllm(tmp_path / "r.jsonl", routings), config, tmp_path / "t.npz", "window=4")
    rows = [[i for i, s in enumerate(trace.steps) if s.prompt == p] for p in (0, 1)]
    assert [len(r) for r in rows] == [1 + 8, 1 + 9]  # a prefill, then a decode forward per fed-back token
    prefill, first = trace.steps[0], trace.steps[1]
    assert (prefill.kind, trace.n_tokens[0], trace.n_context[0]) == ("prefill", 5, 5)
    assert (first.kind, first.block, first.step, trace.n_tokens[1], trace.n_context[1]) == ("decode", 0, 0, 1, 6)
    fifth = trace.steps[5]  # decode d = 4: the second window of 4 steps
    assert (fifth.block, fifth.step, fifth.is_first_block, trace.n_context[5]) == (1, 0, False, 10)
    assert [s.global_step for s in trace.steps] == list(range(len(trace)))
    loads = trace.loads.numpy()
    assert (loads[0].sum(-1) == 5 * TOP_K).all()  # the prompt's tokens x top-k per layer
    expected = np.zeros((LAYERS, EXPERTS), dtype=np.int32)
    for layer in range(LAYERS):
        expected[layer, routings[0].generated[3, layer]] = 1
    assert (loads[4] == expected).all()  # decode d = 3 routes the 4th fed-back token's experts
    m = trace.meta
    assert (m["prompts"], m["generated_tokens"], m["decode_steps"], m["generated_per_prompt"]) == (2, 19, 17, [9, 10])
    assert m["absent"] == ["token_texts", "hints"] and not trace.has_hints and m["routing"] == "imported"
    assert m["model"] == "hf" and m["config"] == str(config.resolve())


def test_requests_arrive_in_created_order_and_choices_are_requests(config: Path, tmp_path: Path) -> None:
    a, b, c = random_routing(3, seed=3)
    lines = [completion(a, "late", 2000), chat([b, c], "early", 1000)]  # chat: n=2 choices share one prompt
    lines[1]["choices"][1]["routed_experts"] = c.generated.tolist()
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    trace = imported("vllm", path, config, tmp_path / "t.npz")
    assert trace.meta["requests"] == [f"mixed.jsonl:2 response early choice {i}" for i in (0, 1)] + \
        ["mixed.jsonl:1 response late choice 0"]
    assert trace.meta["generated_per_prompt"] == [b.tokens, c.tokens, a.tokens]
    first_prefill = trace.loads[0].numpy()
    assert (first_prefill.sum(-1) == len(b.prompt) * TOP_K).all()


def test_hints_next_are_the_next_layers_true_loads(config: Path, tmp_path: Path) -> None:
    trace = imported("vllm", write_vllm(tmp_path / "r.jsonl", random_routing(1)), config, tmp_path / "t.npz",
                     "hints=next")
    loads, hints = trace.loads.float(), np.stack([trace.step_hints(s).numpy() for s in range(len(trace))])
    assert (hints[:, :-1] == loads[:, 1:].numpy()).all() and (hints[:, -1] == 0).all()
    assert trace.meta["absent"] == ["token_texts"] and trace.meta["hints"] == "next_layer_loads"


def test_jsonl_fields_are_mapped_and_decoder_layers_translated(config: Path, tmp_path: Path) -> None:
    routings = random_routing(2, seed=4)
    plain = imported("jsonl", write_jsonl(tmp_path / "a.jsonl", jsonl_rows(routings)), config, tmp_path / "a.npz")
    names = {"request": "rid", "layer": "layer_id", "token": "pos", "experts": "topk_ids", "phase": "stage"}
    rows = jsonl_rows(routings, names, layer_offset=1)  # decoder layers 1..3: layer 0 is dense
    mapped = imported("jsonl", write_jsonl(tmp_path / "b.jsonl", rows), config, tmp_path / "b.npz",
                      "fields=request:rid,layer:layer_id,token:pos,experts:topk_ids,phase:stage", "layers=decoder")
    assert mapped.loads.equal(plain.loads) and mapped.steps == plain.steps
    no_phase = [{k: v for k, v in row.items() if k != "phase"} for row in jsonl_rows(routings)]
    decode_only = imported("jsonl", write_jsonl(tmp_path / "c.jsonl", no_phase), config, tmp_path / "c.npz")
    assert {s.kind for s in decode_only.steps} == {"decode"}  # no split: every token one decode forward
    assert decode_only.meta["generated_per_prompt"] == [len(r.prompt) + len(r.generated) for r in routings]


# ---- malformed files: one line naming the request and the position, exit code 2 -----------------

def _vllm(tmp_path: Path, edit) -> Path:
    routings = random_routing(2, seed=5)
    responses = [completion(r, f"cmpl-{i}", 1000 + i) for i, r in enumerate(routings)]
    edit(responses)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in responses) + "\n")
    return path


def _set(i: int, key: str, value, choice: bool = True):
    def edit(responses: list) -> None:
        (responses[i]["choices"][0] if choice else responses[i])[key] = value
    return edit


def _routes(i: int, fn, choice: bool = True):
    def edit(responses: list) -> None:
        holder = responses[i]["choices"][0] if choice else responses[i]
        key = "routed_experts" if choice else "prompt_routed_experts"
        holder[key] = fn(np.asarray(holder[key])).tolist()
    return edit


def _plain(i: int, t: int, layer: int, value: int):
    def fn(a: np.ndarray) -> np.ndarray:
        a[t, layer, 0] = value
        return a
    return _routes(i, fn)


MALFORMED = {
    "wrong shape": (_routes(1, lambda a: a[:, :, 0]), r"bad\.jsonl:2 response cmpl-1 choice 0 routed_experts is not a "
                                                      r"\[tokens, MoE layers, top_k\] array"),
    "ragged": (_set(0, "routed_experts", [[[1, 2, 3, 4]], [[1]]]), r"bad\.jsonl:1 response cmpl-0 choice 0 "
                                                                    r"routed_experts is not .* \(ragged\)"),
    "id out of range": (_plain(1, 2, 1, EXPERTS), r"bad\.jsonl:2 response cmpl-1 choice 0: token \d+ \(generated\) "
                                                  rf"layer 1 routes to expert {EXPERTS}, outside 0\.\.{EXPERTS - 1}"),
    "negative id": (_plain(0, 0, 0, -1), r"cmpl-0 choice 0: token 5 \(generated\) layer 0 routes to expert -1"),
    "layer count": (_routes(0, lambda a: a[:, :2]), r"cmpl-0 choice 0: the generated rows hold 2 MoE layers per token "
                                                    r"but the model's config has 3: the layer count does not match"),
    "top-k": (_routes(0, lambda a: a[:, :, :2]), r"cmpl-0 choice 0: the generated rows list 2 experts per token and "
                                                 r"layer but the model routes top-4"),
    "expert twice": (_routes(1, lambda a: np.concatenate([a[:, :, :1], a[:, :, :3]], axis=2)),
                     r"cmpl-1 choice 0: token 6 \(generated\) layer 0 lists expert \d+ twice in its top-4"),
    "dropped generated token": (_routes(1, lambda a: a[:-2]), r"cmpl-1 choice 0: 8 generated tokens need 7 routing "
                                                              r"rows .* but the file holds 5: generated tokens were "
                                                              r"dropped"),
    "dropped prompt token": (_routes(0, lambda a: a[1:], choice=False),
                             r"cmpl-0 choice 0: the prompt has 5 tokens but its routing holds 4 rows: prompt tokens "
                             r"were dropped"),
    "duplicate response": (lambda rs: rs.append(rs[0]), r"bad\.jsonl:3: response cmpl-0 choice 0 appears twice "
                                                        r"\(first at bad\.jsonl:1\)"),
    "no routing": (_set(1, "routed_experts", None), r"cmpl-1 choice 0 has no routed_experts: start vLLM with "
                                                    r"--enable-return-routed-experts"),
    "not base64": (_set(0, "routed_experts", "%%%"), r"cmpl-0 choice 0 routed_experts is a string but not base64"),
    "streamed": (_set(0, "object", "text_completion.chunk", choice=False), r"bad\.jsonl:1 is a streamed chunk"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_vllm_file_is_one_line_and_exit_2(case: str, config: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    edit, message = MALFORMED[case]
    source = _vllm(tmp_path, edit)
    out = tmp_path / "t.npz"
    with pytest.raises(SystemExit) as exit_info:
        exit_with(main, ["import", "format=vllm", f"in={source}", "model=hf", f"config={config}", f"out={out}"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert re.search(message, err) and not out.exists()


def test_combined_layout_counts_prompt_and_generated_rows(config: Path, tmp_path: Path) -> None:
    (r,) = random_routing(1)
    response = completion(r, "c", 1, layout="combined")
    response["choices"][0]["routed_experts"] = b64_npy(np.concatenate([r.prompt, r.generated[:-3]]))
    path = tmp_path / "c.json"
    path.write_text(json.dumps(response))
    with pytest.raises(HarnessError, match=r"c\.json response c choice 0: routed_experts holds 8 rows but 5 prompt "
                                           r"\+ 7 generated tokens need 11 .* tokens were dropped"):
        main(["import", "format=vllm", f"in={path}", "model=hf", f"config={config}", f"out={tmp_path / 't.npz'}"])
    response["choices"][0]["routed_experts"] = b64_npy(r.generated)  # the prompt's rows missing
    path.write_text(json.dumps(response))
    with pytest.raises(HarnessError, match="the prompt's routing is missing"):
        main(["import", "format=vllm", f"in={path}", "model=hf", f"config={config}", f"out={tmp_path / 't.npz'}"])


def test_n_choices_without_token_ids_and_a_last_token_row(config: Path, tmp_path: Path) -> None:
    a, b = random_routing(2, seed=6)
    response = chat([a, a], "n2", 1)
    for choice in response["choices"]:
        del choice["token_ids"]
    path = tmp_path / "n2.json"
    path.write_text(json.dumps(response))
    with pytest.raises(HarnessError, match=r"n2\.json response n2 choice 0: no token_ids and n=2 choices share "
                                           r"usage's token count; send the requests with return_token_ids=true"):
        main(["import", "format=vllm", f"in={path}", "model=hf", f"config={config}", f"out={tmp_path / 't.npz'}"])
    extra = completion(b, "x", 1)  # a row for the last generated token too: dropped, and counted
    extra["choices"][0]["routed_experts"] = np.concatenate([b.generated, b.generated[:1]]).tolist()
    path.write_text(json.dumps(extra))
    trace = imported("vllm", path, config, tmp_path / "t.npz")
    assert trace.meta["dropped_last_rows"] == 1 and trace.meta["decode_steps"] == len(b.generated)


def test_malformed_ids_and_jsonl_files_name_the_request_and_position(config: Path, tmp_path: Path) -> None:
    routings = random_routing(2, seed=7)
    ids = write_ids(tmp_path / "ids.npz", routings)
    arrays = dict(np.load(ids))
    arrays["request_lengths"] = arrays["request_lengths"] - 1
    np.savez(tmp_path / "short.npz", **arrays)
    cases = [
        ("ids", tmp_path / "short.npz", r"short\.npz: request_lengths add up to \d+ rows but expert_ids holds \d+: "
                                        r"rows were dropped or added"),
    ]
    rows = jsonl_rows(routings)
    missing = [row for row in rows if not (row["request"] == "req-1" and row["token"] == 3)]
    cases.append(("jsonl", write_jsonl(tmp_path / "missing.jsonl", missing),
                  r"request req-1 has no row for token 3 \(its rows jump to token 4\): a dropped token"))
    one_layer = [row for row in rows if not (row["request"] == "req-0" and row["token"] == 2 and row["layer"] == 1)]
    cases.append(("jsonl", write_jsonl(tmp_path / "layer.jsonl", one_layer),
                  r"request req-0 token 2 has no row for MoE layer 1: a dropped row"))
    cases.append(("jsonl", write_jsonl(tmp_path / "dup.jsonl", [*rows, rows[4]]),
                  r"dup\.jsonl:\d+: request req-0 token 4 layer 0 is a duplicate of line 5"))
    cases.append(("jsonl", write_jsonl(tmp_path / "deep.jsonl", jsonl_rows(routings, layer_offset=1)),
                  r"deep\.jsonl:\d+: MoE layer 3 but the model's config has 3: the layer count does not match"))
    for fmt, path, message in cases:
        with pytest.raises(HarnessError, match=message) as info:
            main(["import", f"format={fmt}", f"in={path}", "model=hf", f"config={config}",
                  f"out={tmp_path / 't.npz'}"])
        assert "\n" not in str(info.value)
