"""Fuzzing the two binary formats the harness reads (docs/bad-input.md): safetensors shards and
routing-trace .npz files. Whatever the bytes, the only outcomes are a successful load or a
HarnessError: never another exception, and never a pickle load."""

from __future__ import annotations

import io
import json
import pickle
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.common.errors import HarnessError
from harness.model.checkpoint import ShardMaps, read_shard_header
from harness.placement.trace import RoutingTrace
from tests.bad_input_cases import tiny_trace

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class PickleLoaded(BaseException):
    """Raised by the patched pickle: a BaseException, so no `except Exception` can hide it."""


@pytest.fixture(autouse=True)
def no_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise PickleLoaded("a reader unpickled data")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)


def load_or_refuse(read, data: bytes, name: str):
    """read(path) on a file holding `data`: its result, or None after a HarnessError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, name)
        path.write_bytes(data)
        try:
            return read(path)
        except HarnessError as exc:
            assert "\n" not in str(exc)
            return None


# ---------------------------------------------------------------- safetensors

DTYPE_NAMES = st.sampled_from(["F32", "F16", "BF16", "F64", "I8", "U8", "BOOL", "", "f32"])
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=5))
SHAPES = st.one_of(st.lists(st.integers(-2, 6), max_size=3), JSON_SCALARS)
OFFSETS = st.one_of(st.lists(st.integers(-4, 300), min_size=0, max_size=3), JSON_SCALARS)


@st.composite
def header_entries(draw) -> object:
    entry = {"dtype": draw(st.one_of(DTYPE_NAMES, JSON_SCALARS)), "shape": draw(SHAPES),
             "data_offsets": draw(OFFSETS)}
    for key in draw(st.sets(st.sampled_from(list(entry)), max_size=1)):
        del entry[key]
    return draw(st.one_of(st.just(entry), JSON_SCALARS, st.lists(JSON_SCALARS, max_size=2)))


@st.composite
def shards(draw) -> bytes:
    """A safetensors-like file: well-formed around a fuzzed header, or fuzzed outright."""
    header = draw(st.one_of(
        st.dictionaries(st.text(min_size=1, max_size=4), header_entries(), max_size=4),
        JSON_SCALARS, st.lists(JSON_SCALARS, max_size=3),
    ))
    body = json.dumps(header).encode()
    blob = struct.pack("<Q", len(body)) + body + draw(st.binary(max_size=300))
    return draw(st.one_of(
        st.just(blob),
        st.integers(0, len(blob)).map(lambda n: blob[:n]),  # truncated
        st.binary(max_size=64),  # random bytes
        st.integers(0, 2**64 - 1).map(lambda n: struct.pack("<Q", n) + body),  # a lying length
    ))


def read_and_map(path: Path) -> int:
    """Header and every tensor it declares, as the loader maps them; the elements read."""
    entries = read_shard_header(path)
    maps = ShardMaps()
    try:
        return sum(maps.tensor(e).numel() for e in entries.values())
    finally:
        for m in maps.maps.values():
            m.close()


@FUZZ
@given(shards())
def test_a_fuzzed_shard_loads_or_is_a_harness_error(blob):
    load_or_refuse(read_and_map, blob, "model.safetensors")


def test_a_well_formed_shard_loads():
    data = np.arange(6, dtype=np.float32).tobytes()
    body = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}).encode()
    assert load_or_refuse(read_and_map, struct.pack("<Q", len(body)) + body + data, "model.safetensors") == 6


# ---------------------------------------------------------------- trace .npz


def valid_arrays() -> dict[str, np.ndarray]:
    buf = io.BytesIO()
    trace = tiny_trace(steps=4)
    with tempfile.TemporaryDirectory() as tmp:
        buf.write(trace.save(Path(tmp, "t.npz")).read_bytes())
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


VALID = valid_arrays()
ARRAYS = st.one_of(
    st.lists(st.integers(-5, 2**40), max_size=8).map(np.array),
    st.lists(st.floats(allow_nan=True), max_size=8).map(lambda v: np.array(v, dtype=np.float64)),
    st.text(max_size=20).map(np.array),
    st.integers(-3, 3).map(np.array),
    st.lists(st.integers(0, 9), min_size=1, max_size=3).map(lambda s: np.zeros(s, dtype=np.int32)),
    st.just(np.array([{"pickled": True}], dtype=object)),
)


@st.composite
def trace_files(draw) -> bytes:
    arrays = dict(VALID)
    for key in draw(st.sets(st.sampled_from(sorted(arrays)), max_size=3)):
        if draw(st.booleans()):
            del arrays[key]
        else:
            arrays[key] = draw(ARRAYS)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # object arrays are pickled here: the reader must refuse them
    blob = buf.getvalue()
    return draw(st.one_of(
        st.just(blob),
        st.integers(0, len(blob)).map(lambda n: blob[:n]),
        st.tuples(st.integers(0, len(blob) - 1), st.integers(0, 255)).map(
            lambda p: blob[: p[0]] + bytes([p[1]]) + blob[p[0] + 1 :]),
        st.binary(max_size=200),
    ))


@FUZZ
@given(trace_files())
def test_a_fuzzed_trace_loads_or_is_a_harness_error(blob):
    trace = load_or_refuse(RoutingTrace.load, blob, "trace.npz")
    if trace is not None:  # what loads is usable: the shape the engine reads
        assert tuple(trace.loads.shape) == (len(trace), trace.n_layers, trace.n_experts)


def test_an_object_array_is_refused_without_unpickling():
    buf = io.BytesIO()
    np.savez(buf, **{**VALID, "meta": np.array([{"a": 1}], dtype=object)})
    assert load_or_refuse(RoutingTrace.load, buf.getvalue(), "trace.npz") is None
