"""`hardware=local`: measure this machine for the cost model (harness/accounting/cost.py).

`profile_local` times one expert of the model's nominal shape on the CPU at 1..64 tokens
(bf16, cycling over enough distinct experts that the weights stream from memory as a real
miss does; the fastest of a few calls, then made non-decreasing by `suffix_min`) and, when
CUDA is present, times the GPU expert at 1..4096 tokens and the HBM bandwidth, fits the
cost model's GPU roofline through them (`fit_gpu_roofline`), times pinned
host->device copies of whole experts on a copy stream, and measures the grouped-GEMM tile
(harness/accounting/gemm_tile.py). Results go into one JSON file with
an entry per expert shape, written atomically; `load_hardware` (below) reads it.
Takes seconds.
"""

from __future__ import annotations

import itertools
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
import yaml

from harness.accounting.cost import BYTES_PER_PARAM, HardwareConfig, expert_shape, suffix_min
from harness.accounting.gemm_tile import measure_tile
from harness.common.errors import HarnessError
from harness.common.files import write_json_atomic
from harness.placement.system import MoEGeometry

PROFILE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
PROFILE_VERSION = 1


def _least_seconds(fn, reps: int) -> float:
    """The fastest of `reps` timed calls after one warm-up (first-call allocation and
    thread-pool start-up are not steady state). Noise from other processes only ever adds
    time, so the least-disturbed call is the best estimate of the steady state."""
    fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return min(samples)


def _expert_weights(geometry: MoEGeometry, copies: int, device: str) -> list[tuple[torch.Tensor, ...]]:
    h, i = geometry.hidden_size, geometry.moe_intermediate_size
    return [
        tuple(
            torch.randn(shape, dtype=torch.bfloat16, device=device) * 0.02
            for shape in ((i, h), (i, h), (h, i))
        )
        for _ in range(copies)
    ]


def _swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    F = torch.nn.functional
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def _expert_latency(geometry: MoEGeometry, tokens: Sequence[int], reps: int) -> list[float]:
    """CPU seconds of one expert call at each token count (the fastest of `reps`)."""
    # Cycle over enough distinct experts to exceed the last-level cache: a real miss
    # streams its weights from memory, not from a cache warmed by the previous call.
    copies = min(256, max(2, int(64e6 // geometry.expert_bytes(BYTES_PER_PARAM)) + 1))
    weights = _expert_weights(geometry, copies, "cpu")
    out = []
    turn = itertools.count()
    for n in tokens:
        x = torch.randn(n, geometry.hidden_size, dtype=torch.bfloat16)

        def call(x: torch.Tensor = x) -> None:
            _swiglu(x, *weights[next(turn) % copies])

        with torch.no_grad():
            out.append(_least_seconds(call, reps))
    return out


# ---- CUDA ----------------------------------------------------------------------------------
# Timed with CUDA events on the stream doing the work, over many back-to-back calls: a
# perf_counter around one call plus torch.cuda.synchronize() measures the synchronize
# (tens of microseconds) as much as the kernels. Back-to-back eager launches are also how
# the hybrid executor issues experts, so launch gaps count as they do in a run.
GPU_PROFILE_TOKENS = (1, 8, 32, 128, 512, 2048, 4096)
GPU_STREAMED_BYTES = 256e6  # > the L2 of any current GPU (A100 40 MB, H100/H200 50 MB)
GPU_REPS = 20


def _events_seconds(run: Callable[[], None], stream: torch.cuda.Stream | None = None) -> float:
    """Device seconds of `run()` (which queues work on `stream`, default: the current one)."""
    stream = stream or torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    run()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _gpu_expert_latency(geometry: MoEGeometry, tokens: Sequence[int], reps: int = GPU_REPS) -> list[float]:
    """Device seconds of one expert call at each token count (mean over `reps` calls), cycling
    over enough distinct experts that their weights stream from HBM, not from L2."""
    copies = min(64, max(8, math.ceil(GPU_STREAMED_BYTES / geometry.expert_bytes(BYTES_PER_PARAM))))
    weights = _expert_weights(geometry, copies, "cuda")
    out = []
    with torch.no_grad():
        for n in tokens:
            x = torch.randn(n, geometry.hidden_size, dtype=torch.bfloat16, device="cuda")
            for w in weights:  # warm-up: cuBLAS picks its kernels for this shape once
                _swiglu(x, *w)
            torch.cuda.synchronize()

            def calls(x: torch.Tensor = x) -> None:
                for i in range(reps):
                    _swiglu(x, *weights[i % copies])

            out.append(_events_seconds(calls) / reps)
    return out


def _hbm_gbps(nbytes: int = 1 << 29) -> float:
    """Device-to-device copy bandwidth (read + write) of a buffer far larger than L2."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    seconds = min(_events_seconds(lambda: dst.copy_(src)) for _ in range(3))
    return 2 * nbytes / seconds / 1e9


def _pcie(geometry: MoEGeometry, k: int = 8) -> tuple[float, float]:
    """(pinned host->device GB/s, per-expert-copy latency in us), timed on a copy stream of
    its own as the executor copies: an expert is three tensor copies, k experts back to back."""
    h, i = geometry.hidden_size, geometry.moe_intermediate_size
    shapes = ((i, h), (i, h), (h, i))
    host = [[torch.empty(s, dtype=torch.bfloat16, pin_memory=True) for s in shapes] for _ in range(k)]
    dev = [[torch.empty(s, dtype=torch.bfloat16, device="cuda") for s in shapes] for _ in range(k)]
    big_host = torch.empty(k * geometry.expert_params, dtype=torch.bfloat16, pin_memory=True)
    big_dev = torch.empty(k * geometry.expert_params, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()

    def experts() -> None:
        with torch.cuda.stream(stream):
            for d_expert, h_expert in zip(dev, host, strict=True):
                for d, s in zip(d_expert, h_expert, strict=True):
                    d.copy_(s, non_blocking=True)

    def one_big() -> None:
        with torch.cuda.stream(stream):
            big_dev.copy_(big_host, non_blocking=True)

    experts()  # warm-up
    one_big()
    stream.synchronize()
    per_expert = statistics.median(_events_seconds(experts, stream) for _ in range(5)) / k
    big = statistics.median(_events_seconds(one_big, stream) for _ in range(5))
    expert_bytes = geometry.expert_bytes(BYTES_PER_PARAM)
    gbps = k * expert_bytes / big / 1e9
    latency_s = max(0.0, per_expert - expert_bytes / (gbps * 1e9))  # what three small copies add
    return gbps, latency_s * 1e6


def fit_gpu_roofline(
    geometry: MoEGeometry, tokens: Sequence[int], seconds: Sequence[float], hbm_gbps: float
) -> dict[str, float]:
    """The cost model's GPU expert roofline, gpu(n) = overhead + max(bytes / bw, flops(n) / F),
    through the measured latencies: bw is the measured HBM bandwidth, the overhead what the
    smallest call takes beyond streaming the weights at bw, F what the largest call needs
    beyond the overhead. It reproduces both ends of the table."""
    expert_bytes = geometry.expert_bytes(BYTES_PER_PARAM)
    overhead = max(0.0, seconds[0] - expert_bytes / (hbm_gbps * 1e9))
    flops = 2.0 * geometry.expert_params * tokens[-1]
    compute = max(seconds[-1] - overhead, expert_bytes / (hbm_gbps * 1e9), 1e-9)
    return {"gpu_hbm_gbps": hbm_gbps, "gpu_bf16_tflops": flops / compute / 1e12, "gpu_call_overhead_us": overhead * 1e6}


def _measure_gpu(geometry: MoEGeometry) -> dict[str, Any]:
    """GPU expert latency at several token counts, the roofline fitted to it, and pinned
    host->device copies. Returns the profile entry's GPU part."""
    latency = _gpu_expert_latency(geometry, GPU_PROFILE_TOKENS)
    fitted = fit_gpu_roofline(geometry, GPU_PROFILE_TOKENS, latency, _hbm_gbps())
    pcie_gbps, pcie_latency_us = _pcie(geometry)
    return {
        # `gpu` holds HardwareConfig fields only: load_hardware merges it as is
        "gpu": {**fitted, "pcie_gbps": pcie_gbps, "pcie_latency_us": pcie_latency_us},
        "gpu_table_tokens": list(GPU_PROFILE_TOKENS),
        "gpu_table_seconds": latency,
        "gpu_name": torch.cuda.get_device_name(),
    }


def _pageable_gbps(nbytes: int = 1 << 28) -> float:
    """Host->device GB/s from pageable (ordinary) host memory: the driver stages it through a
    pinned bounce buffer, synchronously for the host."""
    host = torch.empty(nbytes, dtype=torch.uint8)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host)  # warm-up
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        dev.copy_(host)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def profile_local(geometry: MoEGeometry, out_path: str | Path, reps: int = 5,
                  tokens: Sequence[int] = PROFILE_TOKENS, command: str = "hardware=local on first use",
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Measure this machine for the expert shape of `geometry` and merge the result into
    the JSON profile at `out_path` (one entry per expert shape). Takes seconds. `command`
    names what measured it (the profile's source); `extra`: more figures for the entry."""
    path = Path(out_path)
    profile = read_profile(path) or {"version": PROFILE_VERSION, "shapes": {}}
    tokens = list(tokens)
    raw = _expert_latency(geometry, tokens, reps)
    seconds = suffix_min(raw)
    noisy = [n for n, r, m in zip(tokens, raw, seconds, strict=True) if r > 2 * m]
    if noisy:
        print(f"warning: hardware=local: the CPU expert call at {noisy} tokens took more than twice as long as "
              "with more tokens (other processes on the cores?); the profile keeps the faster figures. "
              "Profile on an idle machine for a trustworthy table", file=sys.stderr)
    entry: dict[str, Any] = {
        "cpu_table_tokens": tokens,
        "cpu_table_seconds": seconds,
        "cpu_table_seconds_raw": raw,
        "cpu_threads": torch.get_num_threads(),
        "command": command,
        "gpu": None,
        **(extra or {}),
    }
    if torch.cuda.is_available():
        entry.update(_measure_gpu(geometry))
        entry["gpu"]["pcie_pageable_gbps"] = _pageable_gbps()
        entry["gemm_tile"] = measure_tile(geometry, _events_seconds)  # its tile: None when no staircase shows
    profile["shapes"][expert_shape(geometry)] = entry
    profile.update(
        host=platform.node(), cpu=platform.processor() or platform.machine(), torch=torch.__version__
    )
    write_json_atomic(path, profile)  # a concurrent run never reads half a profile
    return profile


def read_profile(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        profile = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise HarnessError(
            f"hardware profile {path} is not valid JSON ({exc.msg}); delete it to re-profile"
        ) from None
    if profile.get("version") != PROFILE_VERSION or not isinstance(profile.get("shapes"), dict):
        raise HarnessError(f"hardware profile {path} has an unknown format; delete it to re-profile")
    return profile

def load_hardware(hw: HardwareConfig, geometry: MoEGeometry) -> HardwareConfig:
    """The profile a run is charged with: `hw` itself for a static profile; for one
    with `profile_path` (hardware=local) the measured figures, profiling this machine
    first when the file (or this expert shape in it) is missing and profile_if_missing."""
    hw = hardware_from_file(hw)
    if not hw.profile_path:
        return hw
    path = Path(hw.profile_path)
    shape = expert_shape(geometry)
    profile = read_profile(path)
    if profile is None or shape not in profile["shapes"]:
        if not hw.profile_if_missing:
            raise HarnessError(
                f"hardware profile {path} has no entry for expert shape {shape}; "
                "set hardware.profile_if_missing=true to measure this machine"
            )
        profile = profile_local(geometry, path)
    entry = profile["shapes"][shape]
    where = f"measured on {profile.get('host', '?')} ({profile.get('cpu', '?')}, {entry.get('cpu_threads', '?')} " \
            f"threads, torch {profile.get('torch', '?')}): {entry.get('command', 'hardware=local on first use')}"
    updates: dict[str, Any] = {
        "cpu_table_shape": shape,
        "cpu_table_tokens": [int(t) for t in entry["cpu_table_tokens"]],
        "cpu_table_seconds": [float(s) for s in entry["cpu_table_seconds"]],
        "measured": "cpu",
    }
    sources = {**hw.sources, "cpu_table_seconds": where}
    if entry.get("gpu"):
        updates.update({k: float(v) for k, v in entry["gpu"].items()})
        updates["measured"] = "cpu,gpu,pcie"
        sources.update({k: f"{where} on {entry.get('gpu_name', 'the GPU')}" for k in entry["gpu"]})
    tile = (entry.get("gemm_tile") or {}).get("tile")
    if isinstance(tile, int) and not isinstance(tile, bool) and tile >= 1:
        updates["gpu_gemm_tile"] = tile
        sources["gpu_gemm_tile"] = (f"{where} on {entry.get('gpu_name', 'the GPU')}: the step of a batched matmul "
                                    "timed at every token count (harness/accounting/gemm_tile.py)")
    updates["sources"] = sources
    return HardwareConfig(**{**asdict(hw), **updates})  # checked again in __post_init__


def hardware_from_file(hw: HardwareConfig) -> HardwareConfig:
    """`hw.file` (a profile YAML, as `python -m harness.profile` writes) in place of `hw`;
    `hw` itself when no file is named."""
    if not hw.file:
        return hw
    path = Path(hw.file)
    if not path.is_file():
        raise HarnessError(f"hardware.file={path}: no such file; write one with python -m harness.profile out={path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise HarnessError(f"hardware.file={path} is not valid YAML ({' '.join(str(exc).split())[:120]})") from None
    known = {f.name for f in fields(HardwareConfig)}
    unknown = sorted(set(data or {}) - known) if isinstance(data, dict) else ["(not a mapping)"]
    if unknown:
        raise HarnessError(f"hardware.file={path} holds unknown keys {unknown}; it must hold HardwareConfig fields "
                           "(write it with python -m harness.profile)")
    return HardwareConfig(**{**data, "file": None})
