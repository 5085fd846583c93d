"""Hostile inputs, round three (docs/bad-input.md): commands over sweeps that cannot analyse
what they are given, outputs probed before measuring, fixes that are themselves accepted,
Ctrl-C during startup, MLflow failing mid-run, a full disk under Hydra's files, keys given
twice, checkpoint configs with impossible positions. Each case is one line (an `error:`
and exit 2, or one `warning:` where the run can go on); the families' checkpoints are in
tests/unit/test_family_checkpoints.py."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from harness.cli.overrides import precheck
from harness.job.config import register_configs
from tests import bad_input_cases as first
from tests import hostile_cases as cases
from tests.hostile_cases import no_hang, refused  # noqa: F401 - no_hang: an autouse fixture

register_configs()


# ---------------------------------------------------------------- commands over sweeps


@pytest.mark.parametrize("system", ["tide", "fiddler"])
def test_sensitivity_refuses_a_sweep_without_a_contender_and_a_baseline(system, tmp_path):
    from harness.sensitivity.__main__ import main

    sweep = cases.one_system_sweep(tmp_path, system)
    before = first.snapshot(tmp_path)
    first.expect_tool_error(main, [f"sweep={sweep}", "tracking=false"], f"holds system {system} only")
    assert first.snapshot(tmp_path) == before  # no table of nan margins


def report_of(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    from contextlib import redirect_stdout

    from harness.report.tables import main

    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = main([*argv, "--out", str(tmp_path / "report")])
    return code, out.getvalue(), err.getvalue()


def test_report_skips_a_foreign_result_json_with_one_warning(tmp_path):
    runs = tmp_path / "runs"
    (runs / "ours").mkdir(parents=True)
    (runs / "ours" / "result.json").write_text(json.dumps(cases.HARNESS_RESULT))
    (runs / "theirs").mkdir()
    (runs / "theirs" / "result.json").write_text(json.dumps(cases.FOREIGN_RESULT))
    code, out, err = report_of(tmp_path, "--runs", str(runs))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 0 and len(lines) == 1 and lines[0].startswith("warning: skipped ") and "theirs" in lines[0], err
    assert "?-?" not in out and "?-?" not in (tmp_path / "report" / "report.md").read_text()


def test_report_on_foreign_results_only_is_one_line(tmp_path):
    from harness.report.tables import main

    (tmp_path / "runs" / "theirs").mkdir(parents=True)
    (tmp_path / "runs" / "theirs" / "result.json").write_text(json.dumps(cases.FOREIGN_RESULT))
    first.expect_tool_error(main, ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "r")],
                            "not a result of this harness")


# ---------------------------------------------------------------- harness.profile's outputs


@pytest.fixture
def no_measuring(monkeypatch):
    """Any measurement fails the test: a refusal comes before them."""
    import harness.profile as profile

    def measured(*_a, **_k):
        raise AssertionError("measured before checking the outputs")
    monkeypatch.setattr(profile, "host_memory_gbps", measured)
    monkeypatch.setattr(profile, "profile_local", measured)
    return profile


def _profile_args(tmp_path: Path, **over: str) -> list[str]:
    options = {"model": "tiny", "out": str(tmp_path / "box.yaml"), "json": str(tmp_path / "local.json"),
               "max_tokens": "8", "dense_max": "2", "reps": "1", **over}
    return [f"{k}={v}" for k, v in options.items()]


PROFILE_OUTPUTS = {
    "out under /proc": ({"out": "/proc/harness/box.yaml"}, "out="),
    "out a directory": ({"out": "{tmp}"}, "is a directory"),
    "json under /proc": ({"json": "/proc/harness/local.json"}, "json="),
    "json /dev/null": ({"json": "/dev/null"}, "json=/dev/null is a character device"),
    "out already there": ({"out": "{existing}"}, "already holds a profile"),
    "json holding this shape": ({"json": "{table}"}, "which hardware=local reads"),
    "overwrite=maybe": ({"overwrite": "maybe"}, "overwrite="),
}


@pytest.mark.parametrize("name", list(PROFILE_OUTPUTS))
def test_profile_refuses_its_outputs_before_measuring(name, tmp_path, no_measuring):
    from harness.accounting.cost import expert_shape
    from harness.cli.overrides import compose_checked
    from harness.zoo.entry import nominal_geometry

    (tmp_path / "existing.yaml").write_text("name: mine\n")
    shape = expert_shape(nominal_geometry(compose_checked(["model=tiny"]).model))
    (tmp_path / "table.json").write_text(json.dumps({"version": 1, "shapes": {shape: {}}}))
    files = {"tmp": str(tmp_path), "existing": str(tmp_path / "existing.yaml"),
             "table": str(tmp_path / "table.json")}
    over, needle = PROFILE_OUTPUTS[name]
    before = first.snapshot(tmp_path)
    args = _profile_args(tmp_path, **{k: v.format(**files) for k, v in over.items()})
    first.expect_tool_error(no_measuring.main, args, needle)
    assert first.snapshot(tmp_path) == before


def test_profile_overwrite_true_accepts_existing_profiles(tmp_path, no_measuring):
    (tmp_path / "box.yaml").write_text("name: mine\n")
    options = dict(a.split("=", 1) for a in _profile_args(tmp_path, overwrite="true"))
    no_measuring.check_outputs(options, "anything")  # no refusal: the measurements may start


# ---------------------------------------------------------------- fixes that are accepted


@pytest.mark.parametrize(("argv", "fix"), [
    (["topology.n_gpus=0"], []),
    (["topology.n_gpus=-3"], []),
    (["topology.n_gpus=3"], ["topology=multi", "topology.n_gpus=3"]),
    (["topology.n_gpus=1000"], ["topology=multi", "topology.n_gpus=256"]),
])
def test_topology_n_gpus_suggests_a_fix_that_is_accepted(argv, fix, tmp_path):
    text = refused(precheck, "topology=single has one GPU", ["model=tiny", *argv, f"hydra.run.dir={tmp_path}/r"])
    if fix:
        assert " ".join(fix) in text
    else:
        assert "leave topology.n_gpus out" in text
    precheck(["model=tiny", "system=gem", *fix, f"hydra.run.dir={tmp_path}/r"] if fix else
             ["model=tiny", f"hydra.run.dir={tmp_path}/r"])


# ---------------------------------------------------------------- Ctrl-C during startup


@pytest.mark.parametrize("name", list(cases.STARTUP_INTERRUPTS))
def test_ctrl_c_during_the_imports_is_one_line_and_130(name, tmp_path):
    import sys

    from tests import process_wait
    from tests.conftest import REPO
    from tests.harness_cli import harness_env

    module, target, args = cases.STARTUP_INTERRUPTS[name]
    done = process_wait.run([sys.executable, "-c", cases.INTERRUPTED_IMPORT, module, target, *args],
                            f"{name}", cwd=REPO, env=harness_env(tmp_path / "cache"))
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 130 and len(lines) == 1 and lines[0].startswith("interrupted:"), done.stderr
    assert done.stdout == "" and not (tmp_path / "cache").exists()


def test_a_program_that_imports_the_api_keeps_its_own_ctrl_c():
    import signal

    from harness.common import interrupts

    assert signal.getsignal(signal.SIGINT) is not interrupts.on_startup_sigint  # pytest imported harness
    assert not interrupts.is_command(["/usr/bin/python3", "-c"]) and not interrupts.is_command(["ipykernel.py"])
    assert interrupts.is_command(["-m"]) and interrupts.is_command(["/venv/bin/harness-report"])


# ---------------------------------------------------------------- MLflow failing mid-run


def test_a_store_that_becomes_unwritable_mid_run_is_one_warning_line(tmp_path, capfd):
    import sqlite3

    import sqlalchemy.exc
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from harness.common.files import write_json_atomic
    from harness.job import mlflow_log as tracking
    from harness.job.mlflow_log import TrackingConfig
    from tests.integration.test_tracking import hand_made_result, typed

    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'store.db'}")
    write_json_atomic(tmp_path / "a" / "result.json", hand_made_result())
    assert tracking.log_run(typed(hand_made_result()), tmp_path / "a", cfg) is not None
    capfd.readouterr()

    def read_only(conn, cursor, statement, *_):  # what SQLite says once the file cannot be written
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            raise sqlalchemy.exc.OperationalError(statement, (), sqlite3.OperationalError(
                "attempt to write a readonly database"))
    event.listen(Engine, "before_cursor_execute", read_only)
    try:
        write_json_atomic(tmp_path / "b" / "result.json", hand_made_result())
        before = first.snapshot(tmp_path / "b")
        assert tracking.log_run(typed(hand_made_result()), tmp_path / "b", cfg) is None
    finally:
        event.remove(Engine, "before_cursor_execute", read_only)
    out, err = capfd.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: MLflow logging skipped"), err
    assert "attempt to write a readonly database" in lines[0] and "Traceback" not in out + err
    assert first.snapshot(tmp_path / "b") == before  # the result is kept, nothing lost


# ---------------------------------------------------------------- a full disk under Hydra's files


@pytest.mark.parametrize("code", ["ENOSPC", "EROFS", "EDQUOT"])
def test_hydra_config_files_fail_in_one_line_and_leave_no_half_file(code, tmp_path, monkeypatch):
    import errno
    import os

    from omegaconf import OmegaConf

    from harness.cli import hydra_files

    run = tmp_path / ".hydra"
    hydra_files.save_config(OmegaConf.create({"a": 1}), "config.yaml", run)
    assert (run / "config.yaml").read_text() == "a: 1\n"

    def full(*_):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(hydra_files.HydraFileFailed) as info:
        hydra_files.save_config(OmegaConf.create({"a": 2}), "config.yaml", run)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"cannot write {run / 'config.yaml'}"), text
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"] and (run / "config.yaml").read_text() == "a: 1\n"


def test_hydra_uses_the_harness_writer():
    from hydra.core import utils

    from harness.cli import hydra_files

    hydra_files.install()
    assert utils._save_config is hydra_files.save_config
    assert not issubclass(hydra_files.HydraFileFailed, Exception)  # Hydra's `except Exception` lets it through


# ---------------------------------------------------------------- keys twice, impossible positions


@pytest.mark.parametrize("name", list(cases.REPEATED_KEYS))
def test_a_key_given_twice_is_refused_naming_both(name, tmp_path):
    argv, needle = cases.REPEATED_KEYS[name]
    refused(precheck, needle, ["model=tiny", *argv, f"hydra.run.dir={tmp_path}/r"])


def test_a_key_given_twice_with_one_value_is_accepted(tmp_path):
    precheck(["model=tiny", "decode.gen_length=16", "decode.gen_length=16", f"hydra.run.dir={tmp_path}/r"])


@pytest.mark.parametrize("name", list(cases.LLADA2_CONFIGS))
def test_a_llada2_config_with_impossible_positions_is_refused(name, tiny_dir, tmp_path):
    import shutil

    from harness.model.checkpoint import from_pretrained

    directory = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, directory)
    changes, needle = cases.LLADA2_CONFIGS[name]
    cases.edit_config(directory, changes)
    refused(from_pretrained, needle, directory)


@pytest.mark.parametrize("name", list(cases.FAMILY_CONFIGS))
def test_a_family_config_with_impossible_positions_is_refused(name, tmp_path):
    from harness.families.loading import load_pretrained

    directory = cases.saved_family(tmp_path / "ckpt", "mixtral")
    changes, needle = cases.FAMILY_CONFIGS[name]
    cases.edit_config(directory, changes)
    refused(load_pretrained, needle, directory)


def test_a_sweep_lists_its_failed_jobs_one_line_each(tmp_path):
    from harness.cli.callbacks import failed_lines

    for job, error in (("10", "ten broke"), ("2", "two\\nbroke"), ("0", None)):
        (tmp_path / job).mkdir()
        if error is not None:
            (tmp_path / job / "failed.json").write_text(json.dumps({"error": error.replace("\\n", "\n")}))
    assert failed_lines(tmp_path) == ["[failed] #2: two broke", "[failed] #10: ten broke"]
