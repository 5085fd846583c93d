"""`python -m harness.profile`: measure this machine into a hardware profile a run accepts.

    python -m harness.profile                       # mini's expert shape -> outputs/hardware/local.yaml
    python -m harness.profile model=flash out=conf/hardware/mybox.yaml name=mybox
    python -m harness source=trace hardware.file=outputs/hardware/local.yaml   # a run charged with it
    python -m harness hardware=local                                            # the same table, via local.json

What it measures (harness/accounting/profiling.py does the timing):
  CPU expert latency of the model's nominal expert shape at tile boundaries (1, 2, 4, 8,
  then multiples of 16 to 64, of 32 to 128, of 64 to max_tokens), the table the cost model
  interpolates; a dense check of every token count from 1 to dense_max against that
  interpolation (how far the charge is from a measurement between boundaries); host memory
  bandwidth (a large copy); with CUDA the GPU expert latency, HBM bandwidth (fitted to the
  GPU roofline), pinned and pageable host->device copies, and the grouped-GEMM tile
  (`gpu_gemm_tile`, harness/accounting/gemm_tile.py); without CUDA the tile is not
  measured and the profile keeps its default, and says so.
Writes: the YAML profile at `out` (every HardwareConfig field, each constant with its
source: "measured on <host> ...: <this command>"; without CUDA the GPU and PCIe figures
are a100_pcie4's, with their sources), its details beside it (`<out>.json`), and the
entry `hardware=local` reads (`json`, default conf/hardware/local.yaml's profile_path).
The outputs are probed before anything is measured, and a profile already there is
replaced only with overwrite=true (docs/bad-input.md).
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import yaml

from harness.accounting.cost import BYTES_PER_PARAM, CostModel, HardwareConfig, expert_shape
from harness.accounting.profiling import _expert_latency, load_hardware, profile_local, read_profile
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError, exit_with
from harness.common.files import write_atomic, write_json_atomic
from harness.common.keyvalue import KeyValueCommand, Option, program_name
from harness.common.paths import file_kind, probe_output_dir
from harness.job.config import register_configs
from harness.placement.system import MoEGeometry
from harness.zoo.entry import nominal_geometry

COMMAND = KeyValueCommand("python -m harness.profile", "measure this machine into a hardware profile a run accepts", [
    Option("model", "whose nominal expert shape to time", "mini"),
    Option("out", "the YAML profile to write", "outputs/hardware/local.yaml"),
    Option("name", "the profile's name", "local"),
    Option("max_tokens", "the largest token count on the CPU expert curve", "256"),
    Option("dense_max", "the dense check: every token count from 1 to this", "64"),
    Option("reps", "timing repetitions per point", "5"),
    Option("json", "the entry hardware=local reads", "outputs/cache/hardware/local.json"),
    Option("overwrite", "replace a profile already at out= (or this shape's entry in json=)", "false"),
], example="python -m harness.profile model=flash out=conf/hardware/mybox.yaml name=mybox")
MEMORY_BYTES = 1 << 28  # a copy far larger than any last-level cache


def tile_tokens(max_tokens: int) -> list[int]:
    """1, 2, 4, 8, multiples of 16 up to 64, of 32 up to 128, of 64 beyond, up to max_tokens."""
    if max_tokens < 1:
        raise HarnessError(f"max_tokens={max_tokens} must be at least 1")
    grid = [1, 2, 4, 8, *range(16, 65, 16), *range(96, 129, 32), *range(192, max_tokens + 1, 64)]
    return sorted({n for n in grid if n <= max_tokens} | {max_tokens})


def host_memory_gbps(nbytes: int = MEMORY_BYTES, reps: int = 3) -> float:
    """Host memory bandwidth (read + write) of a large copy, the fastest of `reps`."""
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(reps))
    return 2 * nbytes / best / 1e9


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def dense_check(geometry: MoEGeometry, hw: HardwareConfig, dense_max: int, reps: int) -> dict[str, Any]:
    """Every token count 1..dense_max measured against the table's interpolation: the
    relative error of the charge between tile boundaries."""
    tokens = [n for n in range(1, dense_max + 1) if n not in hw.cpu_table_tokens]
    if not tokens:
        return {"tokens": [], "seconds": [], "max_rel_error": 0.0, "mean_rel_error": 0.0}
    measured = _expert_latency(geometry, tokens, reps)
    cost = CostModel(geometry, hw)
    errors = [abs(cost.cpu_expert_time(n) - m) / m for n, m in zip(tokens, measured, strict=True)]
    worst = max(range(len(errors)), key=errors.__getitem__)
    return {"tokens": tokens, "seconds": measured, "rel_errors": errors, "max_rel_error": errors[worst],
            "max_error_at_tokens": tokens[worst], "mean_rel_error": sum(errors) / len(errors)}


def fitted_cpu_roofline(geometry: MoEGeometry, tokens: list[int], seconds: list[float], mem_gbps: float
                        ) -> dict[str, float]:
    """The CPU roofline through the table's ends: the overhead is what one token takes
    beyond streaming the weights, the throughput what the largest call needs beyond it."""
    expert_bytes = geometry.expert_bytes(BYTES_PER_PARAM)
    overhead = max(0.0, seconds[0] - expert_bytes / (mem_gbps * 1e9))
    compute = max(seconds[-1] - overhead, 1e-12)
    return {"cpu_mem_gbps": mem_gbps, "cpu_tflops": 2.0 * geometry.expert_params * tokens[-1] / compute / 1e12,
            "cpu_call_overhead_us": overhead * 1e6}


def tile_record(entry: dict[str, Any], kept: int) -> dict[str, Any]:
    """What became of the grouped-GEMM tile (`gpu_gemm_tile`): measured, not found in the
    GPU's timings, or not measurable here (no CUDA); the last two keep the profile's `kept`."""
    measured = entry.get("gemm_tile")
    if measured is None:
        return {"measured": False, "tile": kept,
                "note": f"grouped-GEMM tile: no CUDA on this machine, so it cannot be measured; the profile keeps "
                        f"hardware.gpu_gemm_tile={kept} (an assumption, docs/dali-and-gem.md)"}
    if measured.get("tile") is None:
        return {"measured": False, "tile": kept,
                "note": f"grouped-GEMM tile: the batched matmul's timings at {measured['tokens'][0]}.."
                        f"{measured['tokens'][-1]} tokens show no staircase of 8..128 rows; the profile keeps "
                        f"hardware.gpu_gemm_tile={kept} (the timings are in the details file)"}
    return {"measured": True, "tile": measured["tile"],
            "note": f"grouped-GEMM tile: {measured['tile']} rows, measured ({measured['shape']})"}


def parse(argv: list[str]) -> dict[str, str]:
    COMMAND.prog = program_name(COMMAND.prog)
    return COMMAND.parse(argv)


def _int(options: dict[str, str], key: str) -> int:
    try:
        return int(options[key])
    except ValueError:
        raise HarnessError(f"{key}={options[key]!r} must be an integer") from None


def check_outputs(options: dict[str, str], shape: str) -> None:
    """Before measuring (tens of seconds): every output is a file (or nothing yet) in a
    directory this user can write, and no profile already there is replaced unless
    overwrite=true (json= is what hardware=local reads; docs/bad-input.md)."""
    if options["overwrite"].lower() not in ("true", "false"):
        raise HarnessError(f"overwrite={options['overwrite']!r} must be true or false")
    overwrite = options["overwrite"].lower() == "true"
    out = Path(options["out"])
    for key, path in (("out", out), ("out", out.with_suffix(out.suffix + ".json")), ("json", Path(options["json"]))):
        kind = file_kind(path)
        if kind not in ("missing", "file"):
            raise HarnessError(f"{key}={path} is {kind}; give a file path for the profile")
        probe_output_dir(path.parent, key, create=False)
    if overwrite:
        return
    if out.exists():
        raise HarnessError(f"out={out} already holds a profile; give another out= or add overwrite=true to replace it")
    existing = read_profile(Path(options["json"]))
    if existing is not None and shape in existing["shapes"]:
        raise HarnessError(f"json={options['json']} already holds this machine's profile of expert shape {shape}, "
                           "which hardware=local reads; give another json= or add overwrite=true to replace it")


def main(argv: list[str]) -> int:
    options = parse(argv)
    register_configs()
    cfg = compose_checked([f"model={options['model']}", "hardware=local", f"hardware.profile_path={options['json']}"])
    geometry = nominal_geometry(cfg.model)
    reps, max_tokens, dense_max = _int(options, "reps"), _int(options, "max_tokens"), _int(options, "dense_max")
    check_outputs(options, expert_shape(geometry))  # in the first second, not after the measurements
    command = "python -m harness.profile " + " ".join(argv) if argv else "python -m harness.profile"
    tokens = tile_tokens(max_tokens)
    print(f"profiling expert shape {expert_shape(geometry)} (model={options['model']}) on {platform.node()} "
          f"with {torch.get_num_threads()} threads: CPU table at {tokens} tokens", file=sys.stderr)
    mem_gbps = host_memory_gbps()
    profile = profile_local(geometry, options["json"], reps, tokens, command, {"host_memory_gbps": mem_gbps})
    hw = load_hardware(cfg.hardware, geometry)  # the entry just written, as hardware=local reads it
    dense = dense_check(geometry, hw, dense_max, max(1, reps // 2))
    fitted = fitted_cpu_roofline(geometry, hw.cpu_table_tokens, hw.cpu_table_seconds, mem_gbps)
    where = hw.sources["cpu_table_seconds"]
    sources = {**hw.sources, **{k: f"{where} (fitted to the CPU table's ends and the host copy bandwidth; "
                                    "the table itself charges)" for k in fitted}}
    out = HardwareConfig(**{**asdict(hw), **fitted, "name": options["name"], "profile_path": None,
                            "profile_if_missing": False, "sources": sources, "file": None})
    path = Path(options["out"])
    write_atomic(path, lambda f: f.write(yaml.safe_dump(asdict(out), sort_keys=False, width=1000).encode()))
    tile = tile_record(profile["shapes"][expert_shape(geometry)], out.gpu_gemm_tile)
    print(tile["note"], file=sys.stderr)
    write_json_atomic(path.with_suffix(path.suffix + ".json"), {
        "host": profile.get("host"), "cpu": profile.get("cpu"), "torch": torch.__version__,
        "command": command, "host_memory_gbps": mem_gbps, "dense_check": dense, "gemm_tile": tile,
        "entry": profile["shapes"][expert_shape(geometry)]})
    print(f"wrote {path} (and {path}.json); CPU table {len(tokens)} points, dense check 1..{options['dense_max']}: "
          f"max error {100 * dense['max_rel_error']:.1f}% (mean {100 * dense['mean_rel_error']:.1f}%), "
          f"host memory {mem_gbps:.1f} GB/s. Use it: python -m harness hardware.file={path} (or hardware=local)")
    return 0


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
