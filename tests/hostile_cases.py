"""Hostile inputs, round two (docs/bad-input.md), for tests/unit/test_hostile_inputs.py: non-finite
weights, files that load but are not what they claim, things that are not regular files,
unwritable outputs; and round three (tests/unit/test_hostile_round_three.py,
tests/unit/test_family_checkpoints.py, and ROUND_THREE through the command line in
tests/integration/test_hostile_cli.py): the families' checkpoints, commands over sweeps,
harness.profile's outputs, Ctrl-C during imports, keys given twice, impossible positions.
The first round's cases and helpers are in tests/bad_input_cases.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.common.errors import HarnessError
from harness.model.checkpoint import index_checkpoint
from tests.bad_input_cases import _entry, tiny_trace, write_shard

# ---------------------------------------------------------------- what every case asserts


@pytest.fixture(autouse=True)
def no_hang():
    """A case that blocks (a FIFO opened for reading) fails after 120 s instead of hanging (a busy
    machine may take 20 s over a case that opens an MLflow store)."""
    def hung(*_: object) -> None:
        raise TimeoutError("the case hung")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def refused(call: Callable[..., Any], needle: str, *args: Any, **kwargs: Any) -> str:
    """call(*args) raises a one-line HarnessError holding `needle`; its text."""
    with pytest.raises(HarnessError) as info:
        call(*args, **kwargs)
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text, text
    assert needle in text, text
    return text


# ---------------------------------------------------------------- things that are not regular files


def make_special(path: Path, kind: str) -> Path:
    """Put a non-regular file at `path`: fifo, zero (a link to /dev/zero), dir, broken (a
    dangling link) or socket (bound in a short temporary dir: sun_path holds 108 bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "dir":
        path.mkdir()
    elif kind == "broken":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "socket":
        sock_dir = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(sock_dir / "s"))
        server.close()
        path.symlink_to(sock_dir / "s")
    return path


SPECIAL = {"fifo": "FIFO", "zero": "character device", "dir": "directory", "broken": "broken symbolic link",
           "socket": "socket"}

# ---------------------------------------------------------------- non-finite weights

BF16 = {"nan": b"\xc0\x7f", "inf": b"\x80\x7f", "-inf": b"\x80\xff"}
F32 = {"nan": struct.pack("<f", float("nan")), "inf": struct.pack("<f", float("inf")),
       "-inf": struct.pack("<f", float("-inf"))}


def poison(directory: Path, tensor: str, value: str, index: int = 0) -> None:
    """Overwrite element `index` of `tensor` in the checkpoint's shard with NaN or +-Inf."""
    entry = index_checkpoint(directory)[tensor]
    raw = (BF16 if entry.dtype == "BF16" else F32)[value]
    with entry.shard.open("r+b") as f:
        f.seek(entry.begin + index * len(raw))
        f.write(raw)


NON_FINITE = {
    "lm_head NaN": ("lm_head.weight", "nan", 0),
    "lm_head Inf in its last element": ("lm_head.weight", "inf", 512 * 32 - 1),
    "embeddings Inf": ("model.word_embeddings.weight", "inf", 5),
    "embeddings -Inf": ("model.word_embeddings.weight", "-inf", 0),
    "expert bias NaN": ("model.layers.1.mlp.gate.expert_bias", "nan", 3),
    "expert bias Inf": ("model.layers.2.mlp.gate.expert_bias", "inf", 255),
    "router weight NaN": ("model.layers.1.mlp.gate.weight", "nan", 100),
    "one expert's weight NaN": ("model.layers.2.mlp.experts.200.up_proj.weight", "nan", 7),
    "shared expert -Inf": ("model.layers.1.mlp.shared_experts.down_proj.weight", "-inf", 1),
    "final norm NaN": ("model.norm.weight", "nan", 0),
    "attention weight Inf": ("model.layers.0.attention.query_key_value.weight", "inf", 9),
    "dense layer NaN": ("model.layers.0.mlp.down_proj.weight", "nan", 2),
}


def poisoned_checkpoint(tiny_dir: Path, target: Path, name: str) -> Path:
    shutil.copytree(tiny_dir, target)
    poison(target, *NON_FINITE[name])
    return target


# ---------------------------------------------------------------- safetensors that load but lie

D32 = bytes(32)
OVERLAPS: dict[str, tuple[dict, bytes]] = {
    "same offsets": ({"a": _entry(), "b": _entry()}, D32),
    "partial overlap": ({"a": _entry(), "b": _entry(offsets=(8, 24))}, D32),
    "one inside another": ({"a": _entry(shape=(2, 4), offsets=(0, 32)), "b": _entry(shape=(2,), offsets=(8, 16))},
                           D32),
    "overlap listed last": ({"b": _entry(offsets=(16, 32)), "c": _entry(shape=(1,), offsets=(28, 32)),
                             "a": _entry()}, D32),
}


def overlapping_shard(path: Path, name: str) -> Path:
    return write_shard(path, *OVERLAPS[name])


CHECKPOINT_FILES = ("config.json", "model.safetensors.index.json", "tokenizer.json")


def checkpoint_with_special(tiny_dir: Path, target: Path, member: str, kind: str) -> Path:
    """A copy of the tiny checkpoint whose `member` (a file name, or 'shard' for its first
    shard) is replaced by a special file."""
    shutil.copytree(tiny_dir, target)
    name = next(p.name for p in sorted(target.glob("*.safetensors"))) if member == "shard" else member
    make_special(target / name, kind)
    return target


# ---------------------------------------------------------------- traces that load but lie


def _npy_header(shape: tuple[int, ...], dtype: str = "<i4") -> bytes:
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    pad = 64 - (10 + len(header) + 1) % 64
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header) + pad + 1) + header + b" " * pad + b"\n"


def _rewrite_member(path: Path, member: str, data: bytes, compress: bool = True) -> None:
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members[member] = data
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", mode) as z:
        for name, blob in members.items():
            z.writestr(name, blob)


def _edit_arrays(path: Path, edit: Callable[[dict], None]) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    with path.open("wb") as f:
        np.savez(f, **arrays)


def _empty(a: dict) -> None:
    for key in list(a):
        if key in ("loads", "hints") or key.startswith("step_"):
            a[key] = a[key][:0]


def _scale_loads(factor: int) -> Callable[[dict], None]:
    return lambda a: a.__setitem__("loads", a["loads"] * factor)


def _one_hot_load(a: dict) -> None:
    loads = a["loads"].copy()
    loads[0, 0, 0] += 10_000  # one expert alone gets far more pairs than the forward routed
    a["loads"] = loads


TRACES: dict[str, tuple[Callable[[Path], Any], str]] = {
    "a .npy array": (lambda p: np.save(p.open("wb"), np.zeros((4, 2, 256), np.int32)), ".npy"),
    "loads declaring 2.6e15 elements": (lambda p: _rewrite_member(p, "loads.npy", _npy_header((2_600_000_000_000_000,))
                                                                  + bytes(64)), "declares"),
    "loads declaring more than they hold": (lambda p: _rewrite_member(p, "loads.npy", _npy_header((8, 2, 256))
                                                                      + bytes(1024)), "declares"),
    "loads declaring less than they hold": (lambda p: _rewrite_member(p, "loads.npy", _npy_header((1,))
                                                                      + bytes(1024)), "declares"),
    "stored member declaring 1e12 elements": (lambda p: _rewrite_member(p, "meta.npy", _npy_header((10**12,), "<U1")
                                                                        + bytes(8), compress=False), "declares"),
    "an object array member": (lambda p: _rewrite_member(p, "meta.npy", _npy_header((1,), "|O") + bytes(8)),
                               "declares"),
    "an empty trace": (lambda p: _edit_arrays(p, _empty), "no forwards"),
    "loads 100x the routed pairs": (lambda p: _edit_arrays(p, _scale_loads(100)), "token-expert pairs"),
    "loads 3x the routed pairs": (lambda p: _edit_arrays(p, _scale_loads(3)), "token-expert pairs"),
    "one expert with 10000 extra pairs": (lambda p: _edit_arrays(p, _one_hot_load), "token-expert pairs"),
    "a zip with no arrays": (lambda p: zipfile.ZipFile(p, "w").close(), "corrupt"),
    "a zip holding a text file": (lambda p: _rewrite_member(p, "loads.npy", b"hello"), "corrupt"),
    "an empty file": (lambda p: p.write_bytes(b""), "corrupt"),
    "a JSON file": (lambda p: p.write_text('{"loads": []}'), "corrupt"),
}


def broken_trace(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = tiny_trace().save(directory / "trace.npz")
    TRACES[name][0](path)
    return path


# ---------------------------------------------------------------- prompts files

PROMPT_FILES: dict[str, tuple[bytes, str]] = {
    "a lone high surrogate": (b'{"prompt": "ok \\ud800 there"}\n', ":1 holds invalid Unicode"),
    "a lone low surrogate on line 2": (b'{"prompt": "fine"}\n{"prompt": "\\udfff"}\n', ":2 holds invalid Unicode"),
    "invalid UTF-8 on line 3": (b'{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "\xff"}\n', "line 3"),
    "an overlong UTF-8 encoding": (b'{"prompt": "\xc0\xaf"}\n', "line 1"),
    "UTF-16 with its BOM": ('{"prompt": "x"}\n'.encode("utf-16"), "not UTF-8"),
    "a truncated UTF-8 sequence at the end": (b'{"prompt": "x"}\n\xe2\x82', "line 2"),
    "a BOM then a lone surrogate": (b'\xef\xbb\xbf{"prompt": "\\ud834"}\n', "invalid Unicode"),
    "two BOMs": (b'\xef\xbb\xbf\xef\xbb\xbf{"prompt": "x"}\n', "not valid JSON"),
}


def write_prompts(tmp: Path, content: bytes) -> Path:
    path = tmp / "prompts.jsonl"
    path.write_bytes(content)
    return path


# ---------------------------------------------------------------- cached references


def damage_reference(path: Path, how: str) -> None:
    entry = json.loads(path.read_text())
    if how == "a token edited":
        entry["tokens"][0][0] += 1
    elif how == "another key":
        entry["key"] = "0" * 16
    elif how == "no key":
        del entry["key"]
    elif how == "no digest":
        del entry["digest"]
    elif how == "one prompt missing":
        entry["tokens"] = entry["tokens"][:1]
        entry["digest"] = _digest(entry["tokens"])
    elif how == "a row too short":
        entry["tokens"][0] = entry["tokens"][0][:-1]
        entry["digest"] = _digest(entry["tokens"])
    elif how == "a float token":
        entry["tokens"][0][0] = 1.5
        entry["digest"] = _digest(entry["tokens"])
    elif how == "a negative token":
        entry["tokens"][0][0] = -1
        entry["digest"] = _digest(entry["tokens"])
    elif how == "a bool token":
        entry["tokens"][0][0] = True
        entry["digest"] = _digest(entry["tokens"])
    elif how == "tokens a string":
        entry["tokens"] = "1 2 3"
    elif how == "a JSON list":
        entry = [entry]
    if how == "truncated":
        path.write_text(path.read_text()[:20])
    elif how in ("a FIFO", "a directory"):
        path.unlink()
        make_special(path, "fifo" if how == "a FIFO" else "dir")
    else:
        path.write_text(json.dumps(entry))


def _digest(tokens: Any) -> str:
    from harness.decode.lossless import tokens_digest

    return tokens_digest(tokens)


REFERENCE_DAMAGE = ("a token edited", "another key", "no key", "no digest", "one prompt missing", "a row too short",
                    "a float token", "a negative token", "a bool token", "tokens a string", "a JSON list",
                    "truncated", "a FIFO", "a directory")


# ---------------------------------------------------------------- the transformers families' checkpoints


def saved_family(directory: Path, name: str) -> Path:
    """The tiny model of family `name` (tests/family_models.py) saved by transformers'
    save_pretrained, as a checkpoint someone would pass as model.path."""
    from tests.family_models import tiny_model

    _, model = tiny_model(name)
    model.save_pretrained(str(directory))
    return directory


def first_weight(directory: Path) -> str:
    """The name of the first floating tensor of a saved checkpoint (the embeddings)."""
    return sorted(name for name in index_checkpoint(directory) if "embed" in name)[0]


def truncate_shards(directory: Path) -> None:
    """Cut every safetensors file of the checkpoint in half (an interrupted download)."""
    for shard in directory.glob("*.safetensors"):
        size = shard.stat().st_size
        with shard.open("r+b") as f:
            f.truncate(size // 2)


FAMILY_DAMAGE: dict[str, tuple[Callable[[Path], Any], str]] = {
    "a NaN weight": (lambda d: poison(d, first_weight(d), "nan", 3), "holds NaN or Inf"),
    "an Inf weight": (lambda d: poison(d, first_weight(d), "inf", 0), "holds NaN or Inf"),
    "weights cut in half": (truncate_shards, "is truncated"),
}


# ---------------------------------------------------------------- round three: commands over sweeps and outputs


HARNESS_RESULT = {  # the fields a report row reads
    "schema": 1, "system": "tide", "model": "mini", "weights": "proxy", "timing": "modeled", "hardware": "a100_pcie4",
    "budget": {"name": "10GB", "experts_per_layer": 64},
    "config": {"model": {"name": "mini"}, "decode": {"gen_length": 32, "block_length": 32, "cache": "prefix"},
               "system": {"name": "tide"}, "budget": {"name": "10GB"}},
    "metrics": {"tokens_per_s": 100.0, "miss_rate": 0.2, "io_gb": 0.1, "lossless": 1}}
FOREIGN_RESULT = {"model_name": "bert-base", "accuracy": 0.91, "results": [{"task": "mnli", "acc": 0.84}]}


def one_system_sweep(root: Path, system: str = "tide") -> Path:
    """A replay sweep dir holding one finished job of one system (hand-written result)."""
    job = root / "sweep" / "0"
    (job / ".hydra").mkdir(parents=True)
    overrides = ["model=tiny", "source=trace", f"system={system}", "tracking.enabled=false"]
    (job / ".hydra" / "overrides.yaml").write_text("\n".join(f"- {o}" for o in overrides) + "\n")
    (job / "result.json").write_text(json.dumps({
        "schema": 1, "system": system, "model": "tiny", "source": "trace", "metrics": {"tokens_per_s": 10.0},
        "config": {"system": {"name": system}}, "budget": {"name": "custom"}}))
    return root / "sweep"


# ---------------------------------------------------------------- Ctrl-C during a command's imports

# `python -m <module> <args>` with a SIGINT sent to itself when <target> is first imported: a
# Ctrl-C at a known point of the imports, without timing (a meta path finder that only watches)
INTERRUPTED_IMPORT = """
import os, runpy, signal, sys
module, target, *args = sys.argv[1:]
class Interrupt:
    def find_spec(self, name, path=None, target_module=None):
        if name == target:
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["-m", *args]  # what python -m shows while it imports the module's package
runpy._run_module_as_main(module)
"""

# (module, the import during which Ctrl-C comes, arguments)
STARTUP_INTERRUPTS = {
    "harness, importing hydra": ("harness", "hydra", ["model=tiny"]),
    "harness, importing torch": ("harness", "torch", ["model=tiny"]),
    "harness, importing mlflow's store": ("harness", "harness.tracking.mlflow_store", ["model=tiny"]),
    "harness.sensitivity, importing torch": ("harness.sensitivity", "torch", ["sweep=nowhere"]),
    "harness.report, importing pandas": ("harness.report", "pandas", ["--runs", "nowhere"]),
    "harness.profile, importing yaml": ("harness.profile", "yaml", []),
}


# ---------------------------------------------------------------- the last of issue 39's catalogue

REPEATED_KEYS = {
    "decode.gen_length twice": (["decode.gen_length=16", "decode.steps=4", "decode.gen_length=32"],
                                "decode.gen_length is given twice (decode.gen_length=16 and decode.gen_length=32)"),
    "a + key then the key": (["+seed_note=1", "seed_note=2"], "seed_note is given twice"),
    "system twice": (["system=tide", "system=fiddler"], "system is given twice"),
}

# config.json edits of a LLaDA2 checkpoint (tiny) and of a family's (tiny mixtral) refused in one line
LLADA2_CONFIGS = {
    "an odd rotary dimension": ({"head_dim": 10, "partial_rotary_factor": 0.5}, "rotary dimension of 5"),
    "a zero rotary dimension": ({"partial_rotary_factor": 0.01}, "rotary dimension of 0"),
    "max_position_embeddings 10**12": ({"max_position_embeddings": 10**12}, "max_position_embeddings=1000000000000"),
}
FAMILY_CONFIGS = {
    "an odd head_dim": ({"head_dim": 15}, "rotary dimension of 15"),
    "an odd partial rotary dimension": ({"partial_rotary_factor": 0.3125}, "rotary dimension of 5"),
    "max_position_embeddings 10**12": ({"max_position_embeddings": 10**12}, "max_position_embeddings=1000000000000"),
    "max_position_embeddings 0": ({"max_position_embeddings": 0}, "max_position_embeddings"),
}


def edit_config(directory: Path, changes: dict[str, Any]) -> None:
    raw = json.loads((directory / "config.json").read_text())
    raw.update(changes)
    (directory / "config.json").write_text(json.dumps(raw))


# ---------------------------------------------------------------- round three through the command line

# name -> (module, arguments ({placeholders}: round_three_files), what the one line holds, exit code);
# the expected line is `error: ...` on stderr for exit 2, one `warning: ...` line for exit 0.
# Cases the command line cannot set up are tested where they can be: Ctrl-C during imports
# (STARTUP_INTERRUPTS), a store failing mid-run (test_hostile_round_three), a full disk under
# .hydra and a sweep whose second job fails (tests/integration/test_hostile_cli.py).
_RUN = ["decode.gen_length=4", "decode.block_length=4", "decode.steps=2", "limit_prompts=1", "tracking.enabled=false",
        "cache_dir={tmp}/cache", "hydra.run.dir={tmp}/run"]
ROUND_THREE: dict[str, tuple[str, list[str], str, int]] = {
    "olmoe checkpoint with a NaN weight": ("harness", ["model=olmoe", "model.path={olmoe_nan}", *_RUN],
                                           "holds NaN or Inf", 2),
    "olmoe checkpoint cut in half": ("harness", ["model=olmoe", "model.path={olmoe_cut}", *_RUN], "is truncated", 2),
    "mixtral checkpoint with 4 experts": ("harness", ["model=mixtral", "model.path={mixtral4}", *_RUN],
                                          "num_experts=4 (experts per MoE layer) but model=mixtral", 2),
    "sensitivity on a one-system sweep": ("harness.sensitivity", ["sweep={sweep1}", "tracking=false"],
                                          "holds system tide only", 2),
    "report on foreign results only": ("harness.report", ["--runs", "{foreign}", "--out", "{tmp}/r1"],
                                       "not a result of this harness", 2),
    "report beside a foreign result": ("harness.report", ["--runs", "{mixed}", "--out", "{tmp}/r2"],
                                       "warning: skipped", 0),
    "profile over an existing profile": ("harness.profile", ["model=tiny", "out={profile}", "json={tmp}/p.json"],
                                         "already holds a profile", 2),
    "topology.n_gpus=0": ("harness", ["model=tiny", "topology.n_gpus=0", *_RUN], "leave topology.n_gpus out", 2),
    "a key given twice": ("harness", ["model=tiny", "decode.gen_length=16", "decode.gen_length=32", *_RUN[1:]],
                          "decode.gen_length is given twice", 2),
    "LLaDA2 config with an odd rotary dimension": ("harness", ["model=tiny", "model.path={llada_rotary}", *_RUN],
                                                   "rotary dimension of 5", 2),
    "LLaDA2 config with 10**12 positions": ("harness", ["model=tiny", "model.path={llada_positions}", *_RUN],
                                            "max_position_embeddings=1000000000000", 2),
}


def round_three_files(tmp: Path, tiny_dir: Path) -> dict[str, str]:
    """The files the ROUND_THREE cases name."""
    from tests.family_models import published_routing_model

    _, model = published_routing_model("olmoe")
    for name, damage in (("olmoe_nan", FAMILY_DAMAGE["a NaN weight"][0]), ("olmoe_cut", truncate_shards)):
        model.save_pretrained(str(tmp / name))
        damage(tmp / name)
    saved_family(tmp / "mixtral4", "mixtral")
    one_system_sweep(tmp / "s1")
    for name, results in (("foreign", [FOREIGN_RESULT]), ("mixed", [FOREIGN_RESULT, HARNESS_RESULT])):
        for i, result in enumerate(results):
            (tmp / name / str(i)).mkdir(parents=True)
            (tmp / name / str(i) / "result.json").write_text(json.dumps(result))
    (tmp / "box.yaml").write_text("name: mine\n")
    for name, changes in (("llada_rotary", LLADA2_CONFIGS["an odd rotary dimension"][0]),
                          ("llada_positions", LLADA2_CONFIGS["max_position_embeddings 10**12"][0])):
        shutil.copytree(tiny_dir, tmp / name)
        edit_config(tmp / name, changes)
    names = ("olmoe_nan", "olmoe_cut", "mixtral4", "foreign", "mixed", "llada_rotary", "llada_positions")
    return {"tmp": str(tmp), "sweep1": str(tmp / "s1" / "sweep"), "profile": str(tmp / "box.yaml"),
            **{n: str(tmp / n) for n in names}}
