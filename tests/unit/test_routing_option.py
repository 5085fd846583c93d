"""routing=<regime>: a replay over generated routing records which routing it ran on
(routing_source generated, the regime under routing), and the command's bad input is one line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.report.notes import routing_of
from harness.results.records import record_from_result
from harness.routing.__main__ import main

REPO = Path(__file__).resolve().parents[2]
GOLDEN_MINI = REPO / "tests" / "golden" / "mini" / "trace.npz"
REPLAY = ["model=tiny", "source=trace", "routing=mini_fit", "limit_prompts=2", "decode.gen_length=16",
          "decode.block_length=8", "decode.steps=8", "budget=custom", "budget.experts_per_layer=16",
          "tracking.enabled=false", "show_text=false"]


def test_a_replay_over_a_named_regime_records_generated_routing(tmp_path: Path) -> None:
    register_configs()
    results = {s: run_job(compose_checked([*REPLAY, f"system={s}", f"cache_dir={tmp_path}"]), tmp_path / s)
               for s in ("gpu_only", "fiddler")}
    for result in results.values():
        assert result.identity.routing_source == "generated" and result.identity.trace == "generated:mini_fit"
        assert result.routing["regime"]["name"] == "mini_fit" and result.routing["regime"]["seed"] == 0
        assert result.metrics["prompts"] == 2  # the calibration requests are held out
    gpu, fiddler = results["gpu_only"], results["fiddler"]
    assert gpu.metrics["routed_tokens"] == fiddler.metrics["routed_tokens"]  # every system, the same requests
    assert routing_of(record_from_result(gpu, "test")) == "generated: mini_fit"


def test_generated_routing_needs_a_replay_without_a_trace_path() -> None:
    register_configs()
    with pytest.raises(HarnessError, match="routing=mini_fit replays generated routing"):
        compose_checked(["model=tiny", "routing=mini_fit", "tracking.enabled=false"])


@pytest.mark.parametrize(("args", "message"), [
    (["generate", "regime=nope", "model=tiny", "out=x.npz"], "regime='nope' is neither a regime file"),
    (["generate", "regime=mini_fit", "model=nope", "out=x.npz"], "model='nope' is not allowed"),
    (["generate", "regime=mini_fit", "model=tiny", "out=x.npz", "seed=-1"], "seed='-1' must be a whole number"),
    (["fit", "trace=missing.npz", "out=r.yaml"], "missing.npz"),
    (["fit", "trace=missing.npz", "out=r.yaml", "average=0"], "average='0' must be a whole number >= 1"),
    (["fit", f"trace={GOLDEN_MINI}", "out=r.yaml", "popularity=pareto"],
     "popularity='pareto': give some of zipf, lognormal"),
])
def test_the_command_refuses_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                       message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HarnessError, match=re.escape(message)):
        main(args)
    assert not list(tmp_path.iterdir())  # nothing written


def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "harness.routing", "generate", "regime=nope", "model=tiny",
                           "out=x.npz"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not list(tmp_path.iterdir())


def test_the_default_routing_does_not_enter_the_resume_hash() -> None:
    """Results made before the routing option existed keep their hash (resume=true reuses
    them); a generated routing is another job."""
    from harness.job.resume import config_hash

    register_configs()
    base = ["model=tiny", "source=trace", "tracking.enabled=false", "system=fiddler"]
    implicit = compose_checked(base).as_dict()
    explicit = compose_checked([*base, "routing=recorded"]).as_dict()
    generated = compose_checked([*base, "routing=mini_fit"]).as_dict()
    assert implicit["routing"]["name"] == explicit["routing"]["name"] == "recorded"
    before = {k: v for k, v in implicit.items() if k != "routing"}  # a config of before the option
    assert config_hash(implicit, "cpu") == config_hash(explicit, "cpu") == config_hash(before, "cpu")
    assert config_hash(generated, "cpu") != config_hash(implicit, "cpu")
    assert config_hash({**generated, "routing": {**generated["routing"], "seed": 1}}, "cpu") \
        != config_hash(generated, "cpu")
