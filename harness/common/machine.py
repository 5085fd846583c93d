"""The machine a result or a trace comes from: OS, CPU (model and the vector ISA torch's
kernels run, on which a bf16 decode's tokens can depend), memory and GPU."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def machine_environment() -> dict[str, str]:
    """The OS, CPU model and count, physical memory and, where torch sees one, the GPU."""
    out = {"os": f"{platform.system()} {platform.release()}", "cpu_model": cpu_model(),
           "cpu_kernels": torch.backends.cpu.get_cpu_capability(), "cpu_count": str(os.cpu_count() or 0)}
    try:
        out["ram_gb"] = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 1e9:.1f}"
    except (ValueError, OSError, AttributeError):  # not every OS names these
        out["ram_gb"] = "unknown"
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo on Linux, the platform's processor string elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
