"""Hardware profiles and the latency model that charges every plan (docs/cost-model.md).

Everything is charged for bf16 weights (2 bytes per parameter) and the *nominal* geometry
of the model config, whatever weights actually ran: a proxy run of model=mini is charged
as LLaDA2.0-mini.

One routed expert with n tokens (P = 3 * hidden * moe_intermediate parameters):

    bytes    = 2 P                     flops(n) = 2 P n   (three matmuls, multiply-add)
    gpu(n)   = gpu_call_overhead + max(bytes / gpu_hbm_bw, flops(n) / gpu_bf16_flops)
    cpu(n)   = the measured table of `hardware=local` interpolated linearly (extrapolated
               with its last slope), else cpu_call_overhead + max(bytes / cpu_mem_bw,
               flops(n) / cpu_flops); made nondecreasing in n (more tokens never cost less)
    copy(k)  = k * (bytes / pcie_bw + pcie_latency)   (k experts host -> GPU, one copy each;
               host_memory=pageable: at pcie_pageable_gbps, see harness/accounting/ledger.py for
               why such copies overlap nothing)
    gpu(0) = cpu(0) = 0: an expert with no tokens is not called.

Non-expert work (attention with its projections and QK norms, the router, the shared
expert, the dense first layer(s), lm_head) runs on the GPU; each component is a roofline
(weight bytes and, for attention, K/V bytes against HBM; flops against bf16 throughput)
plus a launch overhead per kernel. Attention scores cost 4 * n_tokens * n_context *
heads * head_dim flops (QK^T and PV).

The layer combine rule is a timeline of one forward: one FIFO PCIe link shared by sync and
async copies, GPU experts waiting for the copies they use; harness/accounting/ledger.py states and charges it.

For one layer with an idle link this is docs/cost-model.md's `combine(gpu + sync copies, cpu)` (max
when overlapping, sum otherwise), and async copies add only max(0, sync + async - that).
The modeled time splits exactly into non-expert + exposed copy waits + GPU experts +
exposed CPU time (the part of the CPU work that runs past the GPU path).

Profiles: `conf/hardware/*.yaml` (schema `HardwareConfig`); `harness.accounting.profiling.load_hardware` returns the
one a run is charged with, for `hardware=local` the figures harness/accounting/profiling.py measured
on this machine (measuring on first use).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from harness.common.errors import HarnessError
from harness.placement.system import MoEGeometry

BYTES_PER_PARAM = 2  # bf16 weights everywhere in the model
# The profile's constants, each of which names its source in `sources` (docs/hardware-profiles.md)
SOURCED_CONSTANTS = ("gpu_hbm_gbps", "gpu_bf16_tflops", "gpu_call_overhead_us", "pcie_gbps", "pcie_latency_us",
                     "cpu_mem_gbps", "cpu_tflops", "cpu_call_overhead_us")
# how a source starts: a vendor's datasheet, a published benchmark, this project's measurement, or an estimate
SOURCE_KINDS = ("datasheet", "benchmark", "measured", "estimate")
HOST_MEMORY = ("pinned", "pageable")
# Kernel launches charged per component (eager PyTorch): qkv, QK-norm+rope, attention,
# output projection; two RMSNorms; gate matmul + top-k; SwiGLU as one call; lm_head.
ATTENTION_CALLS = 4
NORM_CALLS = 2
ROUTER_CALLS = 2
MLP_CALLS = 1
HEAD_CALLS = 1


@dataclass
class HardwareConfig:
    """A hardware profile (the schema of `conf/hardware/*.yaml`). Bandwidths in GB/s
    (1e9 bytes), throughputs in TFLOPS (1e12), overheads and latencies in microseconds."""

    name: str = "a100_pcie4"
    gpu_hbm_gbps: float = 1935.0
    gpu_bf16_tflops: float = 312.0
    gpu_call_overhead_us: float = 10.0
    pcie_gbps: float = 25.0
    pcie_latency_us: float = 10.0
    cpu_mem_gbps: float = 200.0
    cpu_tflops: float = 1.5
    cpu_call_overhead_us: float = 20.0
    # rows (tokens) per M tile of the GPU's grouped expert GEMM: in expert parallelism a GPU's
    # routed experts run as one grouped GEMM whose token rows are padded to this tile
    # (docs/dali-and-gem.md: GEM's latency staircase; measure it on the GPU)
    gpu_gemm_tile: int = 64
    # hardware=local: where the measured profile lives, and whether to measure this
    # machine when it is missing. Empty path: a static profile, nothing to load.
    profile_path: str | None = None
    profile_if_missing: bool = False
    # Measured CPU latency of one expert (tokens -> seconds) for the expert shape
    # "<hidden>x<moe_intermediate>"; empty: use the CPU roofline.
    cpu_table_shape: str = ""
    cpu_table_tokens: list[int] = field(default_factory=list)
    cpu_table_seconds: list[float] = field(default_factory=list)
    measured: str = ""  # what was measured on this machine (for the run record)
    # where host copies of the experts live: pinned (DMA at pcie_gbps, asynchronous) or
    # pageable (staged by the driver through a pinned bounce buffer: pcie_pageable_gbps,
    # synchronous for the host, so a copy overlaps neither compute nor other work)
    host_memory: str = "pinned"
    pcie_pageable_gbps: float | None = None  # measured pageable host->device GB/s (bandwidthTest --memory=pageable)
    # where each constant comes from: "<kind>: <what, with a URL or the command>", kind one of
    # SOURCE_KINDS; the CPU table's source under "cpu_table_seconds" (conf/hardware, docs/hardware-profiles.md)
    sources: dict[str, str] = field(default_factory=dict)
    # a profile YAML written by `python -m harness.profile`: its fields replace this profile's
    file: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def charged_constants(self) -> list[str]:
        """The constants that charge runs: a measured CPU table replaces the CPU roofline."""
        cpu_roofline = ("cpu_mem_gbps", "cpu_tflops", "cpu_call_overhead_us")
        names = [c for c in SOURCED_CONSTANTS if not (self.cpu_table_tokens and c in cpu_roofline)]
        names += ["cpu_table_seconds"] if self.cpu_table_tokens else []
        names += ["pcie_pageable_gbps"] if self.host_memory == "pageable" else []
        return names

    def estimates(self) -> dict[str, str]:
        """The charged constants whose source is an estimate (or missing), with that source."""
        out = {}
        for name in self.charged_constants():
            source = self.sources.get(name, "")
            if not source.startswith(SOURCE_KINDS[:3]):
                out[name] = source or "no source given"
        return out

    def validate(self) -> None:
        for key in ("gpu_hbm_gbps", "gpu_bf16_tflops", "pcie_gbps", "cpu_mem_gbps", "cpu_tflops"):
            if not 0 < float(getattr(self, key)) < math.inf:
                raise HarnessError(
                    f"hardware.{key} must be a finite number > 0 (got {getattr(self, key)}); fix conf/hardware"
                )
        for key in ("gpu_call_overhead_us", "pcie_latency_us", "cpu_call_overhead_us"):
            if not 0 <= float(getattr(self, key)) < math.inf:
                raise HarnessError(
                    f"hardware.{key} must be a finite number >= 0 (got {getattr(self, key)}); fix conf/hardware"
                )
        if isinstance(self.gpu_gemm_tile, bool) or not isinstance(self.gpu_gemm_tile, int) or self.gpu_gemm_tile < 1:
            raise HarnessError(f"hardware.gpu_gemm_tile must be a positive integer (got {self.gpu_gemm_tile!r}); "
                               "fix conf/hardware")
        if self.host_memory not in HOST_MEMORY:
            raise HarnessError(f"hardware.host_memory={self.host_memory!r} is not allowed; use pinned or pageable")
        if self.host_memory == "pageable" and not (
            self.pcie_pageable_gbps is not None and 0 < float(self.pcie_pageable_gbps) < math.inf
        ):
            raise HarnessError(
                f"hardware.host_memory=pageable needs hardware.pcie_pageable_gbps > 0 (got {self.pcie_pageable_gbps}): "
                "the pageable host->device GB/s measured on the machine (CUDA bandwidthTest --memory=pageable)"
            )
        if not all(0 < float(s) < math.inf for s in self.cpu_table_seconds):
            raise HarnessError("hardware.cpu_table_seconds must be finite positive seconds")
        if len(self.cpu_table_tokens) != len(self.cpu_table_seconds):
            raise HarnessError("hardware.cpu_table_tokens and hardware.cpu_table_seconds differ in length")
        if self.cpu_table_tokens and (
            sorted(set(self.cpu_table_tokens)) != list(self.cpu_table_tokens) or self.cpu_table_tokens[0] < 1
        ):
            raise HarnessError("hardware.cpu_table_tokens must be strictly increasing token counts >= 1")


def expert_shape(geometry: MoEGeometry) -> str:
    return f"{geometry.hidden_size}x{geometry.moe_intermediate_size}"


@dataclass(frozen=True)
class NonExpertTime:
    """Non-expert GPU time of one forward, split where the timeline needs it."""

    before_moe: float  # embeddings and the dense first layer(s)
    per_moe_layer: float  # attention, norms, router, shared expert of one MoE layer
    head: float  # final norm and lm_head
    n_moe_layers: int
    attention: float = 0.0  # attention with its projections and norms, one layer (dense or MoE): in the two above
    n_layers: int = 0  # every layer (dense + MoE): how often `attention` is inside `total`

    @property
    def total(self) -> float:
        return self.before_moe + self.n_moe_layers * self.per_moe_layer + self.head

    @property
    def attention_total(self) -> float:
        """The attention part of `total` (the cost breakdown's "attention" component)."""
        return self.n_layers * self.attention


def suffix_min(seconds: Sequence[float]) -> list[float]:
    """Each entry no larger than any later one: a call on n tokens can always be padded to
    a later row's n' > n tokens, so t(n) <= t(n') is achievable; a larger measured t(n) is
    noise (another process on the cores), and it must not raise the rows after it."""
    out, running = [], math.inf
    for s in reversed(seconds):
        running = min(running, s)
        out.append(running)
    return out[::-1]


class CostModel:
    """Seconds for experts, copies and non-expert work under one hardware profile."""

    def __init__(self, geometry: MoEGeometry, hw: HardwareConfig) -> None:
        hw.validate()
        self.geometry = geometry
        self.hw = hw
        self.expert_bytes = float(geometry.expert_bytes(BYTES_PER_PARAM))
        self.flops_per_token = 2.0 * geometry.expert_params
        self._gpu_bw = hw.gpu_hbm_gbps * 1e9
        self._gpu_flops = hw.gpu_bf16_tflops * 1e12
        self._gpu_ov = hw.gpu_call_overhead_us * 1e-6
        self._table = self._cpu_table(hw, geometry)
        self.pageable = hw.host_memory == "pageable"
        link_gbps = float(hw.pcie_pageable_gbps) if self.pageable and hw.pcie_pageable_gbps else hw.pcie_gbps
        self._copy_one = self.expert_bytes / (link_gbps * 1e9) + hw.pcie_latency_us * 1e-6
        self._time_tables: dict[str, np.ndarray] = {}

    @staticmethod
    def _cpu_table(hw: HardwareConfig, geometry: MoEGeometry) -> tuple[list[int], list[float]] | None:
        if not hw.cpu_table_tokens:
            return None
        if hw.cpu_table_shape != expert_shape(geometry):
            raise HarnessError(
                f"hardware.cpu_table_shape={hw.cpu_table_shape!r} was measured for another expert shape "
                f"than this model's {expert_shape(geometry)}; re-profile with hardware=local or "
                "python -m harness.profile model=<this model>"
            )
        # timing noise must not make more tokens cheaper; it only ever adds time, so a row
        # above a later one is the noisy one (see suffix_min)
        return list(hw.cpu_table_tokens), suffix_min([float(s) for s in hw.cpu_table_seconds])

    # ---- experts and copies ----------------------------------------------------------
    def _roofline(self, n: float, bw: float, flops: float, overhead: float) -> float:
        return overhead + max(self.expert_bytes / bw, self.flops_per_token * n / flops)

    def gpu_expert_time(self, n_tokens: int) -> float:
        if n_tokens <= 0:
            return 0.0
        return self._roofline(n_tokens, self._gpu_bw, self._gpu_flops, self._gpu_ov)

    def cpu_expert_time(self, n_tokens: int) -> float:
        if n_tokens <= 0:
            return 0.0
        if self._table is None:
            hw = self.hw
            return self._roofline(
                n_tokens, hw.cpu_mem_gbps * 1e9, hw.cpu_tflops * 1e12, hw.cpu_call_overhead_us * 1e-6
            )
        tokens, seconds = self._table
        if len(tokens) == 1 or n_tokens <= tokens[0]:
            return seconds[0] if n_tokens <= tokens[0] else seconds[0] * n_tokens / tokens[0]
        i = min(bisect.bisect_left(tokens, n_tokens), len(tokens) - 1)  # segment [i-1, i]
        slope = (seconds[i] - seconds[i - 1]) / (tokens[i] - tokens[i - 1])
        return seconds[i - 1] + slope * (n_tokens - tokens[i - 1])

    def gpu_expert_times(self, loads: torch.Tensor) -> torch.Tensor:
        """gpu_expert_time of every entry (float64 tensor), vectorised for the planners."""
        n = loads.to(torch.float64)
        t = torch.clamp(self.flops_per_token * n / self._gpu_flops, min=self.expert_bytes / self._gpu_bw)
        return torch.where(n > 0, t + self._gpu_ov, 0.0)

    def grouped_gpu_expert_times(self, loads: torch.Tensor) -> torch.Tensor:
        """Per expert, its share of a grouped GEMM on one GPU (expert parallelism;
        docs/dali-and-gem.md): the call overhead, the weights streamed once, and the tensor
        core time of its token rows padded to the M tile (`gpu_gemm_tile`), not overlapped
        with the stream. A staircase in the token count: the tiles a GPU's tokens fill, not
        only how many experts it runs, set its latency."""
        n = loads.to(torch.float64)
        tile = float(self.hw.gpu_gemm_tile)
        rows = torch.ceil(n / tile) * tile
        t = self._gpu_ov + self.expert_bytes / self._gpu_bw + self.flops_per_token * rows / self._gpu_flops
        return torch.where(n > 0, t, 0.0)

    def cpu_expert_times(self, loads: torch.Tensor) -> torch.Tensor:
        n = loads.to(torch.float64)
        if self._table is None:
            hw = self.hw
            t = (
                torch.clamp(
                    self.flops_per_token * n / (hw.cpu_tflops * 1e12),
                    min=self.expert_bytes / (hw.cpu_mem_gbps * 1e9),
                )
                + hw.cpu_call_overhead_us * 1e-6
            )
            return torch.where(n > 0, t, 0.0)
        return torch.tensor([self.cpu_expert_time(int(v)) for v in loads.tolist()], dtype=torch.float64)

    def time_table(self, device: str, top: int) -> np.ndarray:
        """float64 [n], n > top: `gpu_expert_times` ("gpu") or `cpu_expert_times` ("cpu")
        of the loads 0..n-1. They are elementwise, so entry v is what they give load v
        anywhere in a vector: planners and the ledger look times up here instead of
        building tensors. Tabulated on first use, grown on demand."""
        table = self._time_tables.get(device)
        if table is None or top >= len(table):
            n = max(256, 2 * len(table) if table is not None else 0, top + 1)
            times = {"gpu": self.gpu_expert_times, "cpu": self.cpu_expert_times}[device]
            table = self._time_tables[device] = times(torch.arange(n)).numpy()
        return table

    def copy_time(self, n_experts: int = 1) -> float:
        return max(n_experts, 0) * self._copy_one

    # ---- non-expert work -------------------------------------------------------------
    def _gpu_roofline(self, weight_bytes: float, flops: float, calls: int) -> float:
        return calls * self._gpu_ov + max(weight_bytes / self._gpu_bw, flops / self._gpu_flops)

    def non_expert_breakdown(self, n_tokens: int, n_context: int) -> NonExpertTime:
        g = self.geometry
        n, ctx = max(n_tokens, 0), max(n_context, n_tokens, 0)
        attn_params = g.attention_params
        kv_bytes = ctx * 2 * g.num_key_value_heads * g.head_dim * BYTES_PER_PARAM
        score_flops = 4.0 * n * ctx * g.num_attention_heads * g.head_dim
        attention = self._gpu_roofline(
            attn_params * BYTES_PER_PARAM + kv_bytes,
            2.0 * attn_params * n + score_flops,
            ATTENTION_CALLS + NORM_CALLS,
        )
        router_params = g.num_experts * g.hidden_size
        router = self._gpu_roofline(router_params * BYTES_PER_PARAM, 2.0 * router_params * n, ROUTER_CALLS)
        shared_params = g.num_shared_experts * g.expert_params
        shared = self._gpu_roofline(shared_params * BYTES_PER_PARAM, 2.0 * shared_params * n, MLP_CALLS)
        dense_params = 3 * g.hidden_size * g.intermediate_size
        dense = attention + self._gpu_roofline(
            dense_params * BYTES_PER_PARAM, 2.0 * dense_params * n, MLP_CALLS
        )
        head_params = g.vocab_size * g.hidden_size
        head = self._gpu_roofline(head_params * BYTES_PER_PARAM, 2.0 * head_params * n, HEAD_CALLS + 1)
        return NonExpertTime(
            before_moe=g.first_k_dense_replace * dense,
            per_moe_layer=attention + router + shared,
            head=head,
            n_moe_layers=g.n_moe_layers,
            attention=attention,
            n_layers=g.first_k_dense_replace + g.n_moe_layers,
        )

    def non_expert_time(self, n_tokens: int, n_context: int) -> float:
        """GPU seconds of everything but the routed experts, for one forward.
        Reference definition: only tests call this (the ledger reads `non_expert_breakdown`)."""
        return self.non_expert_breakdown(n_tokens, n_context).total

    # ---- the layer combine rule ------------------------------------------------------
    def combine(
        self, gpu_s: float, sync_copy_s: float, cpu_s: float, overlap: bool, async_copy_s: float = 0.0
    ) -> float:
        """One layer's expert time with an idle link (docs/cost-model.md)."""
        base = max(sync_copy_s + gpu_s, cpu_s) if overlap else sync_copy_s + gpu_s + cpu_s
        return max(base, sync_copy_s + async_copy_s)
