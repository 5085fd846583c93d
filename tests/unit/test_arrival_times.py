"""The arrival settings (harness/traces/arrival_times.py): a recorded arrival trace read
from JSON or CSV, every bad file and every stray setting a one-line error naming the fix,
and the settings at their defaults leaving a static run's config hash as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.job.resume import config_hash
from harness.traces.arrival_times import ARRIVAL_DEFAULTS, arrival_times, read_arrival_trace
from harness.traces.arrivals import poisson_arrivals

register_configs()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("name", "text"), [
    ("a.json", "[0, 0.5, 0.5, 2.25]"),
    ("a.csv", "0\n0.5\n0.5\n2.25\n"),
    ("a.csv", "request,arrival_s\n7,0\n8,0.5\n9,0.5\n10,2.25\n"),
    ("a.csv", "\ufeffarrival_s\n0\n\n0.5\n0.5\n2.25\n"),  # a byte-order mark and a blank line
])
def test_a_recorded_arrival_trace_reads_as_seconds(tmp_path: Path, name: str, text: str) -> None:
    assert read_arrival_trace(write(tmp_path, name, text), 4) == [0.0, 0.5, 0.5, 2.25]


@pytest.mark.parametrize(("name", "text", "message"), [
    ("a.json", "[0, 1, 2]", "lists 3 arrival times but the replay serves 4 requests"),
    ("a.json", "[0, 2, 1, 3]", r"entry 2 \(1\) comes before entry 1 \(2\)"),
    ("a.json", "[0, -1, 1, 3]", "entry 1 is -1, a negative arrival time"),
    ("a.json", '[0, "x", 1, 3]', "entry 1 is 'x', not a finite number"),
    ("a.json", "[0, true, 1, 3]", "entry 1 is True, not a finite number"),
    ("a.json", "[0, NaN, 1, 3]", "entry 1 is nan, not a finite number"),
    ("a.json", '{"arrivals": [0, 1, 2, 3]}', "holds a JSON dict, not an array"),
    ("a.json", "[0, 1,", "is not valid JSON"),
    ("a.csv", "0\n1\nsoon\n3\n", "entry 2 is 'soon'"),
    ("a.csv", "0,1\n2,3\n", "row 1 has 2 columns"),
    ("a.csv", "time\n0\n1\n2\n3\n", "names no column 'arrival_s'"),
    ("a.txt", "0 1 2 3", "is neither .json nor .csv"),
])
def test_a_bad_arrival_trace_is_a_one_line_error(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(HarnessError, match=message) as info:
        read_arrival_trace(write(tmp_path, name, text), 4)
    assert "\n" not in str(info.value) and "workload.arrival_trace=" in str(info.value)


def test_a_missing_arrival_trace_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"workload.arrival_trace=.*gone.json' does not exist; give a JSON"):
        read_arrival_trace(tmp_path / "gone.json", 2)


@pytest.mark.parametrize(("overrides", "message"), [
    (["workload.arrivals=poisson"], "workload.arrivals=poisson needs workload.arrival_rate"),
    (["workload.arrivals=poisson", "workload.arrival_rate=-2"], "must be a positive number"),
    (["workload.arrivals=trace"], "workload.arrivals=trace needs workload.arrival_trace=<file>"),
    (["workload.arrival_rate=2"], "is the rate of workload.arrivals=poisson, but workload.arrivals=static"),
    (["workload.arrival_seed=3"], "seeds workload.arrivals=poisson, but workload.arrivals=static"),
    (["workload.arrivals=poisson", "workload.arrival_rate=2", "workload.arrival_seed=-1"], "whole number >= 0"),
    (["workload.arrival_trace=a.json"], "is read by workload.arrivals=trace, but workload.arrivals=static"),
    (["workload.arrivals=bursty"], "is not one of static, poisson, trace"),
    (["workload.arrivals=poisson", "workload.arrival_rate=2", "source=live"],
     "workload.arrivals=poisson serves the requests of a recorded trace as they arrive.*add source=trace"),
])
def test_stray_or_missing_arrival_settings_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(HarnessError, match=message) as info:
        compose_checked(["source=trace", *overrides])
    assert "\n" not in str(info.value)


def test_the_settings_give_the_times() -> None:
    cfg = compose_checked(["source=trace", "workload.arrivals=poisson", "workload.arrival_rate=3",
                           "workload.arrival_seed=5"])
    assert arrival_times(cfg.workload, 6) == poisson_arrivals(6, 3.0, 5)
    assert arrival_times(compose_checked(["source=trace"]).workload, 6) is None


@pytest.mark.parametrize("overrides", [["model=tiny", "system=fiddler"],
                                       ["source=trace", "system=gem", "topology=multi", "workload.batch=2"]])
def test_a_static_run_keeps_the_hash_it_had_before_arrivals(overrides: list[str]) -> None:
    """A result written before the arrival settings existed has none in its config: it
    hashes as a static run of today does, so resume=true still finds it."""
    config = compose_checked(overrides).as_dict()
    assert {k: config["workload"][k] for k in ARRIVAL_DEFAULTS} == ARRIVAL_DEFAULTS
    before = {**config, "workload": {k: v for k, v in config["workload"].items() if k not in ARRIVAL_DEFAULTS}}
    assert config_hash(config, "cpu") == config_hash(before, "cpu")
    served = compose_checked([*overrides, "source=trace", "workload.arrivals=poisson", "workload.arrival_rate=2"])
    assert config_hash(served.as_dict(), "cpu") != config_hash(config, "cpu")
    seeded = compose_checked([*overrides, "source=trace", "workload.arrivals=poisson", "workload.arrival_rate=2",
                              "workload.arrival_seed=1"])
    assert config_hash(seeded.as_dict(), "cpu") != config_hash(served.as_dict(), "cpu")
