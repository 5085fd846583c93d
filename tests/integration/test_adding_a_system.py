"""docs/adding-a-system.md, walked: the doc's own `systems/<name>.py` code, run as written,
and its entry registered (the one line in systems/registry.py) are all it takes for
`system=<name>` to compose, show in `--help`, decode live losslessly, replay its own
recording to the same figures and take its place in the report and the sensitivity
analysis."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from harness.cli.help import option_line
from harness.cli.hints import group_options
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.live import run_job
from harness.results.records import system_order
from harness.sensitivity.analysis import Roles
from systems.registry import REGISTRY, registered
from tests.conftest import REPO

DOC = REPO / "docs" / "adding-a-system.md"
RUN = ["model=tiny", "decode.gen_length=12", "decode.block_length=8", "decode.steps=8", "limit_prompts=1",
       "tracking.enabled=false", "budget=custom", "budget.experts_per_layer=64", "system=greedy_cpu"]


def doc_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Step 1: the doc's `systems/<name>.py`, executed as a module of that name."""
    step = DOC.read_text().split("## 1.", 1)[1].split("\n## 2.", 1)[0]
    code = re.search(r"```python\n(.*?)```", step, re.S)
    assert code is not None, "docs/adding-a-system.md step 1 lost its code block"
    module = types.ModuleType("systems.greedy_cpu")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # as an import would (dataclasses look it up)
    exec(compile(code.group(1), str(DOC), "exec"), module.__dict__)
    return module


def test_a_system_is_its_file_and_its_entry(tmp_path: Path, proxy_cache: Path, tiny_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    module = doc_module(monkeypatch)
    assert "greedy_cpu" not in REGISTRY and "greedy_cpu" not in group_options("system")
    with registered(module.ENTRY):  # step 2: the line in ENTRIES
        assert "greedy_cpu" in group_options("system")
        assert "every other routed expert on the CPU" in option_line("system", "greedy_cpu")  # its --help line
        cache = f"cache_dir={proxy_cache}"
        cfg = compose_checked([*RUN, cache, "trace.record=true", "system.overlap=false"])
        assert type(cfg.system) is module.GreedyCpuConfig and cfg.system.overlap is False
        live = run_job(compose_checked([*RUN, cache, "trace.record=true"]), tmp_path / "live")
        m = live.flat_metrics()
        assert live.identity.system == "greedy_cpu" and m["lossless"] == 1
        assert m["cpu_expert_tokens"] > 0 and m["copies_sync"] == 0  # misses on the CPU, nothing copied
        trace = f"trace.path={tmp_path / 'live' / 'trace.npz'}"
        replay = run_job(compose_checked([*RUN, cache, "source=trace", trace]), tmp_path / "replay")
        for key in ("modeled_time_s", "missed_pairs", "routed_pairs", "cpu_expert_tokens"):
            assert replay.metrics[key] == live.metrics[key], key
        # the report lists it after the registered systems; sensitivity takes it as a contender
        assert system_order(["greedy_cpu", "tide", "gpu_only"]) == ["gpu_only", "tide", "greedy_cpu"]
        roles = Roles()
        assert "greedy_cpu" not in roles.references + roles.baselines
    assert "greedy_cpu" not in REGISTRY and "greedy_cpu" not in group_options("system")
    with pytest.raises(HarnessError, match="greedy_cpu"):
        compose_checked([*RUN, f"cache_dir={proxy_cache}"])
