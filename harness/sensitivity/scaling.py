"""Which hardware constants the sensitivity analysis scales, and how.

A factor multiplies the constant's value: 4x a bandwidth or throughput is a faster machine,
4x an overhead or latency a slower one. A profile with a measured CPU table
(hardware=local) is charged by that table, not by the CPU roofline, so there the CPU's
constants are replaced by one, `cpu_table_seconds` (every entry scaled; 4x is slower).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from harness.accounting.cost import HardwareConfig
from harness.common.errors import HarnessError

# what each constant stands for (the table's and plots' labels) and which part of the
# machine it belongs to (a run that never uses that part cannot depend on it)
CONSTANTS: dict[str, tuple[str, str]] = {
    "pcie_gbps": ("PCIe bandwidth", "link"),
    "pcie_latency_us": ("copy latency", "link"),
    "cpu_tflops": ("CPU throughput", "cpu"),
    "cpu_mem_gbps": ("CPU memory bandwidth", "cpu"),
    "cpu_call_overhead_us": ("CPU call overhead", "cpu"),
    "gpu_bf16_tflops": ("GPU throughput", "gpu"),
    "gpu_hbm_gbps": ("GPU memory bandwidth", "gpu"),
    "gpu_call_overhead_us": ("GPU call overhead", "gpu"),
}
TABLE_CONSTANT = "cpu_table_seconds"
ROOFLINE_CPU = ("cpu_tflops", "cpu_mem_gbps", "cpu_call_overhead_us")


def constants_for(hw: HardwareConfig) -> list[str]:
    """The constants that charge runs under `hw`."""
    if hw.cpu_table_tokens:
        return [c for c in CONSTANTS if c not in ROOFLINE_CPU] + [TABLE_CONSTANT]
    return list(CONSTANTS)


def part_of(constant: str) -> str:
    return "cpu" if constant == TABLE_CONSTANT else CONSTANTS[constant][1]


def label_of(constant: str) -> str:
    return "CPU expert table" if constant == TABLE_CONSTANT else CONSTANTS[constant][0]


def scaled(hw: HardwareConfig, constant: str, factor: float) -> HardwareConfig:
    """`hw` with one constant multiplied by `factor` (the pageable link too, when the
    profile charges copies over it)."""
    if not 0 < factor < math.inf:
        raise HarnessError(f"a scale factor must be a finite number > 0 (got {factor})")
    if constant == TABLE_CONSTANT:
        return replace(hw, cpu_table_seconds=[s * factor for s in hw.cpu_table_seconds])
    if constant not in CONSTANTS:
        raise HarnessError(f"unknown hardware constant {constant!r}; choose from {', '.join(CONSTANTS)}, "
                           f"{TABLE_CONSTANT}")
    changes = {constant: getattr(hw, constant) * factor}
    if constant == "pcie_gbps" and hw.pcie_pageable_gbps is not None:
        changes["pcie_pageable_gbps"] = hw.pcie_pageable_gbps * factor
    return replace(hw, **changes)


def scale_grid(low: float, high: float, points: int) -> list[float]:
    """`points` factors from low to high, evenly spaced in log, always holding 1."""
    if not (0 < low < 1 < high < math.inf) or points < 3:
        raise HarnessError(f"scales must satisfy 0 < low < 1 < high with at least 3 points "
                           f"(got low={low}, high={high}, points={points}); e.g. scales=0.25,4,9")
    grid = np.exp(np.linspace(math.log(low), math.log(high), points))
    return sorted({*(float(f) for f in grid), 1.0})
