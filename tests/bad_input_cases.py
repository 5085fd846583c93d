"""Hand-made broken files and tool arguments for tests/integration/test_bad_inputs.py (and the fuzz tests)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.errors import HarnessError

# ---------------------------------------------------------------- files already written


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (relative path -> bytes); {} when it does not exist."""
    if not directory.is_dir():
        return {}
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def write_earlier_result(run_dir: Path) -> dict[str, bytes]:
    """A run dir holding an earlier run's result.json and MLflow marker; its snapshot."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "result.json").write_text(json.dumps({"schema": 1, "system": "tide", "metrics": {"x": 1}}))
    (run_dir / "mlflow.json").write_text(json.dumps({"runs": [{"uri": "sqlite:////x.db", "run_id": "r"}]}))
    return snapshot(run_dir)


# ---------------------------------------------------------------- prompts files

PROMPT_FILES: dict[str, tuple[Any, str]] = {
    "binary": (b"\xff\xfe\x00\x81\x9c binary \x00\x00", "UTF-8"),
    "directory": ("<dir>", "is a directory"),
    "missing": ("<missing>", "does not exist"),
    "empty": ("", "holds no prompts"),
    "not json": ("not json\n", "not valid JSON"),
    "deeply nested json": ("[" * 100_000 + "\n", "not valid JSON"),
    "a list per line": ("[1, 2]\n", "non-empty string"),
    "prompt not a string": ('{"prompt": 5}\n', "non-empty string"),
    "blank prompt": ('{"prompt": "   "}\n', "non-empty string"),
    "oversized": ("<huge>", "MiB"),
}


def write_prompt_file(tmp: Path, content: Any) -> Path:
    path = tmp / "prompts.jsonl"
    if content == "<dir>":
        path.mkdir()
    elif content == "<huge>":
        with path.open("wb") as f:  # sparse: no disk used
            f.truncate(65 * 2**20)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content != "<missing>":
        path.write_text(content)
    return path


# ---------------------------------------------------------------- safetensors shards


def write_shard(path: Path, header: Any, data: bytes = b"", raw: bytes | None = None) -> Path:
    """A safetensors file: u64 header length, the header (JSON of `header`, or `raw` bytes), data."""
    body = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return path


def _entry(dtype: str = "F32", shape: Any = (2, 2), offsets: Any = (0, 16)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets}


DATA16 = bytes(16)

SHARD_HEADERS: dict[str, tuple[tuple, str]] = {
    "header a JSON list": (([],), "not an object"),
    "header a JSON string": (("weights",), "not an object"),
    "entry not an object": (({"w": 5}, DATA16), "not an object"),
    "entry without data_offsets": (({"w": {"dtype": "F32", "shape": [2, 2]}}, DATA16), "data_offsets"),
    "entry without dtype": (({"w": {"shape": [2, 2], "data_offsets": [0, 16]}}, DATA16), "dtype"),
    "unknown dtype": (({"w": _entry(dtype="I8")}, DATA16), "dtype"),
    "dtype not a string": (({"w": _entry(dtype=4)}, DATA16), "dtype"),
    "shape not a list": (({"w": _entry(shape="2x2")}, DATA16), "shape"),
    "negative shape": (({"w": _entry(shape=[-2, -2])}, DATA16), "shape"),
    "bool in shape": (({"w": _entry(shape=[True, 4])}, DATA16), "shape"),
    "offsets reversed": (({"w": _entry(offsets=(16, 0))}, DATA16), "data_offsets"),
    "offsets floats": (({"w": _entry(offsets=(0.0, 16.0))}, DATA16), "data_offsets"),
    "offsets one number": (({"w": _entry(offsets=[16])}, DATA16), "data_offsets"),
    "offsets shorter than the shape": (({"w": _entry(shape=[4, 4])}, DATA16), "needs"),
    "offsets beyond the file": (({"w": _entry(offsets=(0, 64))}, DATA16), "truncated"),
    "header not JSON": ((None, b"", b"{not json"), "corrupt"),
    "header not UTF-8": ((None, b"", b"\xff\xfe{}"), "corrupt"),
}


# ---------------------------------------------------------------- checkpoints


def _edit_config(directory: Path, edit: Callable[[dict], Any]) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _edit_first_shard_header(directory: Path, edit: Callable[[dict], Any]) -> None:
    shard = next(directory.glob("*.safetensors"))
    blob = shard.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    write_shard(shard, edit(json.loads(blob[8 : 8 + n])), blob[8 + n :])


def _first_tensor(header: dict) -> str:
    return next(k for k in header if k != "__metadata__")


def _drop_offsets(header: dict) -> dict:
    del header[_first_tensor(header)]["data_offsets"]
    return header


def _short_offsets(header: dict) -> dict:
    entry = header[_first_tensor(header)]
    entry["data_offsets"][1] = entry["data_offsets"][0]
    return header


def _escaping_index(directory: Path) -> None:
    index = directory / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {k: "../../etc/passwd" for k in data["weight_map"]}
    index.write_text(json.dumps(data))


CHECKPOINTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "config.json a list": (lambda d: _edit_config(d, lambda c: [c]), "not an object"),
    "config n_group=0": (lambda d: _edit_config(d, lambda c: {**c, "n_group": 0}), "n_group"),
    "config hidden_size abc": (lambda d: _edit_config(d, lambda c: {**c, "hidden_size": "abc"}), "hidden_size"),
    "config not UTF-8": (lambda d: (d / "config.json").write_bytes(b"\xff\xfe\x00"), "UTF-8"),
    "header a JSON list": (lambda d: _edit_first_shard_header(d, lambda h: list(h)), "not an object"),
    "entry without data_offsets": (lambda d: _edit_first_shard_header(d, _drop_offsets), "data_offsets"),
    "offsets shorter than the shape": (lambda d: _edit_first_shard_header(d, _short_offsets), "needs"),
    "index escapes the directory": (_escaping_index, "file names inside"),
    "model.path a file": (lambda d: None, "is a file"),
}


def broken_checkpoint(tiny_dir: Path, target: Path, name: str) -> Path:
    """A copy of the tiny proxy checkpoint broken as CHECKPOINTS[name] says."""
    if name == "model.path a file":
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("not a directory")
        return target
    shutil.copytree(tiny_dir, target)
    CHECKPOINTS[name][0](target)
    return target


# ---------------------------------------------------------------- traces


def tiny_trace(model: str = "tiny", steps: int = 8, block: int = 4):
    """A small synthetic routing trace with the geometry of `model` (tiny or mini), as a replay reads it."""
    from harness.bench import synthetic_trace
    from harness.model.config import LLaDA2Config
    from harness.model.proxy import proxy_config

    geometry = proxy_config("tiny") if model == "tiny" else LLaDA2Config.published("llada2_mini")
    trace = synthetic_trace(geometry, steps, 4, block=block)
    trace.meta = {"model": model, "weights": "proxy", "decode": {"steps": block, "cache": "prefix"},
                  "prompts": 1, "generated_tokens": 4, "denoise_steps": steps}
    return trace


def trace_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _rewrite(path: Path, edit: Callable[[dict], None]) -> None:
    arrays = trace_arrays(path)
    edit(arrays)
    with path.open("wb") as f:
        np.savez(f, **arrays)


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda a: a.__setitem__(key, value)


def _first_kind(value: int) -> Callable[[dict], None]:
    def edit(a: dict) -> None:
        a["step_kind"] = a["step_kind"].copy()
        a["step_kind"][0] = value
    return edit


TRACES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "corrupt"),
    "random bytes": (lambda p: p.write_bytes(bytes(range(256)) * 8), "corrupt"),
    "a directory": (lambda p: (p.unlink(), p.mkdir()), "directory"),
    "step kind out of range": (lambda p: _rewrite(p, _first_kind(7)), "step_kind"),
    "meta a list": (lambda p: _rewrite(p, _set("meta", np.array("[1, 2]"))), "meta"),
    "geometry a number": (lambda p: _rewrite(p, _set("geometry", np.array("3"))), "geometry"),
    "no loads": (lambda p: _rewrite(p, lambda a: a.pop("loads")), "loads"),
    "float loads": (lambda p: _rewrite(p, lambda a: a.__setitem__("loads", a["loads"] * 0.5)), "loads"),
    "negative loads": (lambda p: _rewrite(p, lambda a: a.__setitem__("loads", -a["loads"] - 1)), "negative"),
    "schema version a string": (lambda p: _rewrite(p, _set("schema_version", np.array("1"))), "schema version"),
    "an object array": (lambda p: _rewrite(p, _set("meta", np.array([{"a": 1}], dtype=object))), "corrupt"),
    "meta decode steps a list": (lambda p: _rewrite(p, _set("meta", np.array('{"decode": {"steps": [4]}}'))),
                                 "decode.steps"),
    "another model's trace": (lambda p: tiny_trace("mini").save(p), "recorded with model=mini"),
}


def broken_trace(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = tiny_trace().save(directory / "trace.npz")
    TRACES[name][0](path)
    return path


def trace_with_foreign_calibration(directory: Path) -> Path:
    """A tiny trace whose calibration.npz beside it was recorded with model=mini."""
    directory.mkdir(parents=True, exist_ok=True)
    tiny_trace("mini", steps=4).save(directory / "calibration.npz")
    return tiny_trace().save(directory / "trace.npz")


# ---------------------------------------------------------------- tools


def command_line_files(tmp: Path) -> dict[str, str]:
    binary = tmp / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00\x81 not text")
    truncated = tiny_trace().save(tmp / "cut.npz")
    truncated.write_bytes(truncated.read_bytes()[:100])
    plain = tmp / "plain.txt"
    plain.write_text("a file, not a directory")
    (tmp / "somedir").mkdir(exist_ok=True)
    return {"binary": str(binary), "truncated": str(truncated), "file": str(plain), "dir": str(tmp / "somedir"),
            "next_gate_only": str(next_gate_only_trace(tmp / "older"))}


def next_gate_only_trace(folder: Path) -> Path:
    """A recording from before the residual hint channel (next_gate hints only), with its
    calibration beside it: dali's default predictor refuses it."""
    folder.mkdir(exist_ok=True)
    trace = tiny_trace()
    rng = np.random.default_rng(0)
    for s in range(len(trace)):
        trace.set_step(s, trace.loads[s].numpy(), rng.random((trace.n_layers, trace.n_experts)))
    trace.save(folder / "calibration.npz")
    return trace.save(folder / "trace.npz")


def _list_result(tmp: Path) -> Path:
    (tmp / "runs" / "a").mkdir(parents=True)
    (tmp / "runs" / "a" / "result.json").write_text("[1, 2, 3]")
    return tmp / "runs"


def _analyze(*args: str) -> Callable[[Path], tuple[Callable, list[str]]]:
    def build(tmp: Path) -> tuple[Callable, list[str]]:
        from harness.analyze import main

        trace = tiny_trace().save(tmp / "t.npz")
        files = {**command_line_files(tmp), "trace": str(trace)}
        return main, [a.format(**files) for a in args]
    return build


def _bench(*args: str) -> Callable[[Path], tuple[Callable, list[str]]]:
    def build(tmp: Path) -> tuple[Callable, list[str]]:
        from harness.bench import main

        trace = tiny_trace().save(tmp / "t.npz")
        return main, [a.format(trace=trace) for a in args]
    return build


def _report(*args: str) -> Callable[[Path], tuple[Callable, list[str]]]:
    def build(tmp: Path) -> tuple[Callable, list[str]]:
        from harness.report.tables import main

        files = {**command_line_files(tmp), "listresult": str(_list_result(tmp)), "tmp": str(tmp)}
        return main, [a.format(**files) for a in args]
    return build


def _push(*args: str) -> Callable[[Path], tuple[Callable, list[str]]]:
    def build(tmp: Path) -> tuple[Callable, list[str]]:
        from harness.job.mlflow_log import main

        return main, ["push", *(a.format(tmp=tmp) for a in args)]
    return build


TOOLS: dict[str, tuple[Callable[[Path], tuple[Callable, list[str]]], str]] = {
    "analyze without arguments": (_analyze(), "missing trace"),
    "analyze not key=value": (_analyze("trace"), "key=value"),
    "analyze unknown key": (_analyze("trace={trace}", "color=red"), "unknown argument"),
    "analyze missing trace": (_analyze("trace={dir}/none.npz"), "does not exist"),
    "analyze truncated trace": (_analyze("trace={truncated}"), "corrupt"),
    "analyze B=abc": (_analyze("trace={trace}", "B=abc"), "B="),
    "analyze B=0": (_analyze("trace={trace}", "B=0"), "B=0"),
    "analyze B above the experts": (_analyze("trace={trace}", "B=100000"), "B=100000"),
    "analyze max_k=100000": (_analyze("trace={trace}", "max_k=100000"), "max_k=100000"),
    "analyze out=<a file>": (_analyze("trace={trace}", "out={file}"), "out="),
    "bench steps=abc": (_bench("steps=abc"), "steps="),
    "bench steps=0": (_bench("steps=0"), "steps="),
    "bench tokens=-5": (_bench("tokens=-5"), "tokens="),
    "bench repeats=0": (_bench("repeats=0"), "repeats="),
    "bench forward=maybe": (_bench("forward=maybe"), "forward="),
    "bench unknown argument": (_bench("speed=3"), "speed=3"),
    "bench unknown system": (_bench("systems=nope", "forward=false", "steps=4"), "nope"),
    "bench unknown model": (_bench("model=nope"), "model=nope"),
    "bench trace of another model": (_bench("trace={trace}", "forward=false"), "recorded with model=tiny"),
    "report --out <a file>": (_report("--runs", "{tmp}", "--out", "{file}"), "--out"),
    "report --runs missing": (_report("--runs", "{tmp}/none"), "no such directory"),
    "report result.json holding a list": (_report("--runs", "{listresult}", "--out", "{tmp}/o"), "no runs found"),
    "report --from-mlflow garbage": (_report("--from-mlflow", "foo://x"), "--from-mlflow"),
    "report --from-mlflow missing store": (_report("--from-mlflow", "sqlite:///{tmp}/none.db"), "no such SQLite"),
    "report --from-mlflow and --runs": (_report("--from-mlflow", "sqlite:///x.db", "--runs", "{tmp}"), "either"),
    "report unknown flag": (_report("--colour"), "unrecognized"),
    "push --uri garbage": (_push("{tmp}", "--uri", "foo://x"), "--uri"),
    "push missing dir": (_push("{tmp}/none"), "no such directory"),
    "report mistyped key": (_report("ruun={tmp}"), "did you mean runs?"),
    "report mistyped value": (_report("errors=cl"), "did you mean ci?"),
    "push mistyped key": (_push("uir=sqlite:///{tmp}/x.db"), "did you mean uri?"),
    "push unknown flag": (_push("--colour"), "unrecognized"),
}


def tool_case(name: str, tmp: Path) -> tuple[Callable, list[str], str]:
    build, needle = TOOLS[name]
    main, argv = build(tmp)
    return main, argv, needle


def expect_tool_error(main: Callable[[list[str]], int], argv: list[str], needle: str) -> None:
    """main(argv) is exit code 2 with one `error:` line (returned, or raised as a HarnessError
    that `exit_with` prints as one line), and prints nothing else on stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
            text = err.getvalue()
        except HarnessError as exc:
            code, text = 2, err.getvalue() + f"error: {exc}\n"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, text
    assert lines[0].startswith("error:") and needle in lines[0], text


def tiny_unless_model(overrides: list[str]) -> list[str]:
    """model=tiny first, unless the overrides choose the model (a key is given once: the
    command line refuses it twice)."""
    chosen = any(o.split("=", 1)[0].lstrip("+") == "model" for o in overrides)
    return list(overrides) if chosen else ["model=tiny", *overrides]
