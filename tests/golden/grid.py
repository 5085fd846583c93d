"""The fixed grid of the golden-result check (docs/testing.md): every result.json metric of

- tiny, live: every system (and its main variants) x 2 budgets x cache prefix/none;
- mini proxy, replay of one gpu_only trace: every system x 2 budgets. The trace and its
  calibration trace are committed (tests/golden/mini/, a few hundred kB) so that the test
  needs neither the mini proxy (building its balanced expert bias takes minutes) nor a
  recording; the tiny cells cover recording.

`python -m tests.golden.grid` rewrites tests/golden/results.json; tests/golden/test_golden.py
runs the same grid and requires every figure to be equal. A deliberate change of figures
updates the file in its own commit that says why. `python -m tests.golden.grid --retrace`
first records the mini traces again (after a change to the model, the proxy or decoding).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from systems.registry import REGISTRY

GOLDEN = Path(__file__).with_name("results.json")
MINI_TRACES = Path(__file__).with_name("mini")  # trace.npz + calibration.npz

# wall-clock figures never repeat; everything else in `metrics` must
NOT_REPEATABLE = {"wall_s", "load_s", "wall_tokens_per_s", "replay_s", "layer_steps_per_s"}

def registry_variants() -> dict[str, list[str]]:
    """Every registered system (expert-parallel ones with topology=multi) and the extra
    variants its entry names (`tide+async`): a new system joins the grid by registering."""
    variants = {}
    for name, entry in REGISTRY.items():
        base = [f"system={name}", *(["topology=multi"] if entry.multi_gpu else [])]
        variants[name] = base
        for suffix, overrides in entry.golden_variants.items():
            variants[f"{name}{suffix}"] = [*base, *overrides]
    return variants


VARIANTS: dict[str, list[str]] = registry_variants()
TINY_BUDGETS = {"B24": ["budget=custom", "budget.experts_per_layer=24"],
                "B64": ["budget=custom", "budget.experts_per_layer=64"]}
MINI_BUDGETS = {"10GB": ["budget=10GB"], "18GB": ["budget=18GB"]}
TINY_DECODE = ["model=tiny", "decode.gen_length=12", "decode.block_length=8", "decode.steps=8", "limit_prompts=2"]
MINI_RECORD = ["model=mini", "model.weights=random", "decode.gen_length=32", "limit_prompts=1"]
MINI_DECODE = ["model=mini", "model.weights=random", "decode.gen_length=32", "source=trace",
               f"trace.path={MINI_TRACES / 'trace.npz'}"]


def cells() -> Iterator[tuple[str, list[str]]]:
    for name, system in VARIANTS.items():
        for budget, b in TINY_BUDGETS.items():
            for cache in ("prefix", "none"):
                yield f"tiny-live/{name}/{budget}/{cache}", [*TINY_DECODE, *system, *b, f"decode.cache={cache}"]
    for name, system in VARIANTS.items():
        for budget, b in MINI_BUDGETS.items():
            yield f"mini-replay/{name}/{budget}", [*MINI_DECODE, *system, *b]


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """What must stay equal: every repeatable metric, the step series and the system's report."""
    metrics = {k: v for k, v in result["metrics"].items() if k not in NOT_REPEATABLE and not k.startswith("host_")}
    return {"metrics": metrics, "step_series": result["step_series"], "system_report": result["system_report"],
            "budget": result["budget"]}


def run_cell(overrides: list[str], cache: Path, out: Path) -> dict[str, Any]:
    from harness.cli.overrides import compose_checked
    from harness.job.config import register_configs
    from harness.job.live import run_job

    register_configs()
    cfg = compose_checked([*overrides, f"cache_dir={cache}", "tracking.enabled=false", "show_text=false"])
    return figures(run_job(cfg, out))


def run_grid(cache: Path, work: Path) -> dict[str, Any]:
    from tqdm import tqdm

    return {name: run_cell(ov, cache, work / name.replace("/", "_")) for name, ov in tqdm(list(cells()), desc="grid")}


def canonical(value: Any) -> Any:
    """JSON round trip: what the golden file holds (tuples become lists, float bits kept)."""
    return json.loads(json.dumps(value))


def record_mini_traces(cache: Path, work: Path) -> None:
    """A live gpu_only run of the mini proxy that records the traces the mini cells replay."""
    run_cell([*MINI_RECORD, "system=gpu_only", "trace.record=true"], cache, work)
    MINI_TRACES.mkdir(exist_ok=True)
    for name in ("trace.npz", "calibration.npz"):
        shutil.copyfile(work / name, MINI_TRACES / name)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--retrace"]
    cache = Path(args[0]) if args else Path(tempfile.mkdtemp(prefix="golden-cache-"))
    with tempfile.TemporaryDirectory() as work:
        if "--retrace" in sys.argv[1:]:
            record_mini_traces(cache, Path(work) / "mini-record")
        grid = run_grid(cache, Path(work))
    GOLDEN.write_text(json.dumps(grid, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(grid)} cells to {GOLDEN}")


if __name__ == "__main__":
    main()
