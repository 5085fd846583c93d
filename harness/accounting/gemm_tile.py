"""The grouped-GEMM tile, measured (docs/hardware-profiles.md, "The grouped-GEMM tile").

In expert parallelism a GPU runs its routed experts as one grouped GEMM whose token rows
are padded to the kernel's M tile, so an expert's latency is a staircase in its token
count (`hardware.gpu_gemm_tile`, charged by `CostModel.grouped_gpu_expert_times`).
`python -m harness.profile` measures the tile on a GPU: a batched matmul of `GROUPS`
experts' up-projections (bf16, [groups, n, hidden] x [groups, hidden, intermediate]) timed
at every token count n = `SWEEP_FIRST` .. `SWEEP_FIRST + SWEEP_SPAN` (past the GPU's ridge,
where the GEMM is compute-bound: below it the weights' streaming hides the padded rows and
the curve is flat), and `detect_tile` finds the step in the series. Without CUDA nothing
is measured and the profile keeps its default.

`detect_tile` reads a staircase of tile T off the timings as the T for which

  every boundary steps   the single-token step across each multiple of T (n = kT to kT+1)
                         is significant: above `STEP_NOISE` times the noise of the
                         single-token steps inside the blocks (a robust scale: 1.4826 x
                         their median absolute deviation) and above `STEP_FLOOR` of the
                         median time; and
  no block steps inside  no single-token step inside a block (between two multiples of T)
                         reaches half the median boundary step.

A multiple of the true tile fails the second rule (a true boundary lies inside its
blocks), a divisor the first (half its boundaries do not step); a smooth or linear curve
fails the first (its boundary steps are its inside steps). None when no candidate passes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

import torch

from harness.placement.system import MoEGeometry

TILE_CANDIDATES = (8, 16, 32, 64, 128)
SWEEP_FIRST = 256  # past the ridge of current GPUs (H200: ~200 FLOPs per byte, 2 per token-weight)
SWEEP_SPAN = 512  # four boundaries of the largest candidate
GROUPS = 8  # experts in the batched matmul (one GPU's share of a layer)
REPS = 20
STEP_NOISE = 6.0
STEP_FLOOR = 0.01


def detect_tile(tokens: Sequence[int], seconds: Sequence[float],
                candidates: Sequence[int] = TILE_CANDIDATES) -> int | None:
    """The tile of the staircase `seconds` measured at the consecutive token counts
    `tokens` (module docstring); None when there is no staircase of a candidate tile."""
    if len(tokens) != len(seconds) or any(b != a + 1 for a, b in pairwise(tokens)):
        raise ValueError("detect_tile needs one time per consecutive token count")
    at = {n: float(s) for n, s in zip(tokens, seconds, strict=True)}
    level = statistics.median(at.values()) if at else 0.0
    found = []
    for tile in candidates:
        boundaries = [n for n in tokens if n % tile == 0 and n + 1 in at]
        if len(boundaries) < 2:  # two steps at least, or a single jump could be anything
            continue
        steps = [at[n + 1] - at[n] for n in boundaries]
        inside = [at[n + 1] - at[n] for n in tokens if n % tile != 0 and n + 1 in at]
        if not inside:
            continue
        centre = statistics.median(inside)
        noise = 1.4826 * statistics.median(abs(d - centre) for d in inside)
        threshold = max(STEP_NOISE * noise + abs(centre), STEP_FLOOR * level)
        if min(steps) <= threshold:
            continue
        if max(abs(d) for d in inside) >= 0.5 * statistics.median(steps):
            continue
        found.append(tile)
    return max(found) if found else None


def measure_tile(geometry: MoEGeometry, device_seconds: Callable[[Callable[[], None]], float],
                 first: int = SWEEP_FIRST, span: int = SWEEP_SPAN, reps: int = REPS) -> dict[str, Any]:
    """On CUDA: the batched matmul's device seconds at first..first+span tokens per expert
    (`device_seconds(run)` times what `run` queues) and the tile detected in them (None
    when the series shows no staircase of a candidate tile)."""
    h, i = geometry.hidden_size, geometry.moe_intermediate_size
    weights = torch.randn(GROUPS, h, i, dtype=torch.bfloat16, device="cuda") * 0.02
    tokens = list(range(first, first + span + 1))
    seconds = []
    with torch.no_grad():
        for n in tokens:
            x = torch.randn(GROUPS, n, h, dtype=torch.bfloat16, device="cuda")
            torch.bmm(x, weights)  # warm-up: the library picks its kernel for this shape once
            torch.cuda.synchronize()

            def calls(x: torch.Tensor = x) -> None:
                for _ in range(reps):
                    torch.bmm(x, weights)

            seconds.append(device_seconds(calls) / reps)
    return {"tokens": tokens, "seconds": seconds, "tile": detect_tile(tokens, seconds), "groups": GROUPS,
            "shape": f"[{GROUPS}, n, {h}] x [{GROUPS}, {h}, {i}] bf16 (torch.bmm)"}
