"""The live-path benchmark: its phase accounting on a hand-made clock, and one real run on tiny."""

from __future__ import annotations

import json

import pytest

import harness.bench_live as bench
from harness.common.errors import HarnessError


class FakeClock:
    """Both clocks advance only when `tick` says: phase arithmetic is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def test_a_phase_inside_another_is_taken_out_of_the_outer_one(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench.time, "thread_time", clock)
    monkeypatch.setattr(bench.time, "perf_counter", clock)
    phases = bench.Phases()

    inner = phases.wrap("experts", lambda: clock.tick(2.0))

    def layer() -> None:
        clock.tick(1.0)
        inner()
        clock.tick(0.5)
        inner()

    phases.wrap("engine", layer)()
    assert phases.clocks["engine"].cpu == 1.5 and phases.clocks["engine"].wall == 1.5  # 5.5 in all, 4 inner
    assert phases.clocks["experts"].cpu == 4.0 and phases.clocks["experts"].calls == 2
    assert phases.clocks["engine"].calls == 1


def test_patched_functions_are_restored_even_after_an_error():
    class Owner:
        @staticmethod
        def work() -> int:
            return 1

    original = Owner.work
    with pytest.raises(RuntimeError), bench.patched([(Owner, "work", lambda fn: lambda: 2)]):
        assert Owner.work() == 2
        raise RuntimeError
    assert Owner.work is original


def test_a_tiny_run_reports_every_phase_and_the_same_tokens_as_the_plain_model(proxy_cache, tiny_dir, tmp_path,
                                                                               monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_CACHE", str(proxy_cache))
    out = tmp_path / "bench.json"
    assert bench.main(["models=tiny", "build=false", "main=false", "gen_length=8", "format=json", f"out={out}"]) == 0
    report = json.loads(out.read_text())
    tiny = report["models"]["tiny"]
    assert tiny["same_tokens"] == "True"  # the engine changes where experts run, never the tokens
    for phase in ("attention", "router", "engine", "experts", "combine", "other"):
        assert tiny[f"{phase}_ms_per_forward"] >= 0, phase
    assert tiny["forwards"] > 0 and tiny["engine_vs_plain"] > 0 and tiny["load_vs_read"] > 0
    assert tiny["experts_vs_batched"] > 0
    assert json.loads(capsys.readouterr().out)["models"]["tiny"]["forwards"] == tiny["forwards"]


@pytest.mark.parametrize(("args", "needle"), [
    (["models=nope"], "choose from"), (["build=maybe"], "build="), (["threads=0"], "threads"),
    (["format=xml"], "format="), (["frobnicate=1"], "unknown argument"),
])
def test_bad_arguments_are_one_line_errors(args, needle):
    with pytest.raises(HarnessError, match=needle):
        bench.main(args)
