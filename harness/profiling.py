"""`hardware=local`: measure this machine for the cost model (harness/cost.py).

`profile_local` times one expert of the model's nominal shape on the CPU at 1..64 tokens
(bf16, cycling over enough distinct experts that the weights stream from memory as a real
miss does) and, when CUDA is present, fits the GPU expert roofline to measured latencies
and times pinned host->device copies. Results go into one JSON file with an entry per
expert shape, written atomically; `harness.cost.load_hardware` reads it. Takes seconds.
"""

from __future__ import annotations

import itertools
import json
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from harness.cost import BYTES_PER_PARAM, expert_shape
from harness.errors import HarnessError
from harness.model.config import LLaDA2Config

PROFILE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
PROFILE_VERSION = 1


def _median_seconds(fn, reps: int) -> float:
    fn()  # warm-up: first-call allocation and thread-pool start-up are not steady state
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _expert_weights(geometry: LLaDA2Config, copies: int, device: str) -> list[tuple[torch.Tensor, ...]]:
    h, i = geometry.hidden_size, geometry.moe_intermediate_size
    return [
        tuple(
            torch.randn(shape, dtype=torch.bfloat16, device=device) * 0.02
            for shape in ((i, h), (i, h), (h, i))
        )
        for _ in range(copies)
    ]


def _expert_latency(geometry: LLaDA2Config, tokens: Sequence[int], device: str, reps: int) -> list[float]:
    # Cycle over enough distinct experts to exceed the last-level cache: a real miss
    # streams its weights from memory, not from a cache warmed by the previous call.
    copies = (
        min(256, max(2, int(64e6 // geometry.expert_bytes(BYTES_PER_PARAM)) + 1)) if device == "cpu" else 8
    )
    weights = _expert_weights(geometry, copies, device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    out = []
    turn = itertools.count()
    for n in tokens:
        x = torch.randn(n, geometry.hidden_size, dtype=torch.bfloat16, device=device)

        def call(x: torch.Tensor = x) -> None:
            gate, up, down = weights[next(turn) % copies]
            torch.nn.functional.linear(
                torch.nn.functional.silu(torch.nn.functional.linear(x, gate))
                * torch.nn.functional.linear(x, up),
                down,
            )
            sync()

        with torch.no_grad():
            out.append(_median_seconds(call, reps))
    return out


def _measure_gpu(geometry: LLaDA2Config) -> dict[str, float]:
    """Fit the GPU roofline to measured expert latencies, and time pinned H2D copies."""
    big = (1, 4096)
    t_small, t_big = _expert_latency(geometry, big, "cuda", reps=5)
    host = torch.empty(
        int(geometry.expert_bytes(BYTES_PER_PARAM)) // 2 * 8, dtype=torch.bfloat16
    ).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    tiny_host, tiny_dev = host[:256], dev[:256]

    def copy_big() -> None:
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()

    def copy_tiny() -> None:
        tiny_dev.copy_(tiny_host, non_blocking=True)
        torch.cuda.synchronize()

    t_copy, t_tiny = _median_seconds(copy_big, 5), _median_seconds(copy_tiny, 5)
    expert_bytes = geometry.expert_bytes(BYTES_PER_PARAM)
    return {
        "gpu_hbm_gbps": expert_bytes / t_small / 1e9,  # effective, launch overhead included
        "gpu_bf16_tflops": 2.0 * geometry.expert_params * big[1] / t_big / 1e12,
        "gpu_call_overhead_us": 0.0,
        "pcie_gbps": host.numel() * 2 / max(t_copy - t_tiny, 1e-9) / 1e9,
        "pcie_latency_us": t_tiny * 1e6,
    }


def profile_local(geometry: LLaDA2Config, out_path: str | Path, reps: int = 5) -> dict[str, Any]:
    """Measure this machine for the expert shape of `geometry` and merge the result into
    the JSON profile at `out_path` (one entry per expert shape). Takes seconds."""
    path = Path(out_path)
    profile = read_profile(path) or {"version": PROFILE_VERSION, "shapes": {}}
    seconds = _expert_latency(geometry, PROFILE_TOKENS, "cpu", reps)
    entry: dict[str, Any] = {
        "cpu_table_tokens": list(PROFILE_TOKENS),
        "cpu_table_seconds": seconds,
        "cpu_threads": torch.get_num_threads(),
        "gpu": _measure_gpu(geometry) if torch.cuda.is_available() else None,
    }
    if entry["gpu"] is not None:
        entry["gpu_name"] = torch.cuda.get_device_name()
    profile["shapes"][expert_shape(geometry)] = entry
    profile.update(
        host=platform.node(), cpu=platform.processor() or platform.machine(), torch=torch.__version__
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(profile, indent=2))
    tmp.replace(path)  # atomic: a concurrent run never reads half a profile
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
