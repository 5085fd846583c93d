"""Hostile inputs, round two (docs/bad-input.md): options, outputs, stores and interrupts. Each case
is a one-line HarnessError or exit code 2 with one `error:` line, nothing written where it
should not be; valid inputs that used to fail (glob sweeps, a huge range with
sweep.max_jobs) are accepted. The files the harness reads are in tests/unit/test_hostile_inputs.py."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import socket
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest

import harness.common.files as results
from harness.cli.overrides import precheck
from harness.common.errors import OutputError, exit_with
from harness.common.paths import as_output_error, probe_output_dir
from harness.job.config import register_configs
from tests import bad_input_cases as first
from tests import hostile_cases as cases
from tests.hostile_cases import no_hang, refused  # noqa: F401 - no_hang: an autouse fixture (a FIFO never hangs)

register_configs()


def store_files(tmp: Path) -> dict[str, str]:
    """A file, a SQLite database that is not MLflow's, a text file named .db, a FIFO."""
    plain = tmp / "plain.txt"
    plain.write_text("a file")
    foreign = tmp / "foreign.db"
    with contextlib.closing(sqlite3.connect(foreign)) as db:
        db.execute("create table users (name text)")
        db.commit()
    (tmp / "text.db").write_text("not a database")
    cases.make_special(tmp / "fifo.db", "fifo")
    return {"tmp": str(tmp), "file": str(plain), "foreign": str(foreign), "text": str(tmp / "text.db"),
            "fifo": str(tmp / "fifo.db")}


# ---------------------------------------------------------------- the command line (precheck)

MULTI = ["topology=multi", "system=gem"]
PRECHECK = [
    (["workload=humaneval", "workload.path={file}"], "both set"),
    (["workload=jsonl", "workload.path={file}", "workload.dataset=humaneval"], "both set"),
    (["source=trace", "trace.record=true"], "trace.record"),
    (["trace.path={file}"], "trace.path"),
    (["source=live", "trace.path={file}", "trace.record=true"], "trace.path"),
    ([*MULTI, "topology.n_gpus=100000"], "topology.n_gpus"),
    ([*MULTI, "topology.n_gpus=257"], "topology.n_gpus"),
    ([*MULTI, "topology.n_gpus=1"], "topology.n_gpus"),
    ([*MULTI, "topology.seed=-1"], "topology.seed"),
    ([*MULTI, "topology.speeds=[1,inf,1,1]"], "topology.speeds"),
    ([*MULTI, "topology.speeds=[1,nan,1,1]"], "topology.speeds"),
    (["decode.temperature=1e308"], "decode.temperature"),
    (["decode.temperature=1e-300"], "decode.temperature"),
    (["decode.temperature=5e-324"], "decode.temperature"),
    (["decode.temperature=0.0001"], "decode.temperature"),
    (["decode.temperature=1001"], "decode.temperature"),
    (["-m", "decode.seed=range(0,100000000)"], "100,000,000 jobs"),
    (["-m", "decode.seed=range(0,20000)"], "sweep.max_jobs=10,000"),
    (["-m", "decode.seed=range(0,30)", "model.proxy_seed=range(0,30)", "topology.seed=range(0,30)"], "27,000 jobs"),
    (["-m", "decode.seed=range(0,100)", "sweep.max_jobs=50"], "sweep.max_jobs=50"),
    (["-m", "decode.seed=1,2,3", "sweep.max_jobs=2"], "3 jobs"),
    (["sweep.max_jobs=0"], "sweep.max_jobs"),
    (["sweep.max_jobs=abc"], "sweep.max_jobs"),
    (["sweep.max_jobs=²"], "sweep.max_jobs"),
    (["-m", "decode.seed=range(5,5)"], "no jobs"),
    (["-m", "decode.seed=range(10,0)"], "no jobs"),
    (["-m", "system=glob(nothing*)"], "matches no option"),
    (["-m", "decode.seed=glob(*)"], "not one"),
    (["-m", "model=glob(x*)"], "matches no option"),
    (["--frobnicate"], "--frobnicate"),
    (["-x"], "'-x'"),
    (["--multirun=yes"], "--multirun=yes"),
    (["--config-name", "nope"], "no such config"),
    (["-cn", "nope"], "no such config"),
    (["--config-name=nope"], "no such config"),
    (["-cn"], "needs a value"),
    (["hydra.run.dir={file}"], "is a file"),
    (["hydra.run.dir={file}/run"], "is a file"),
    (["hydra.run.dir={file}/a/run"], "is under"),
    (["-m", "hydra.sweep.dir={file}"], "is a file"),
    (["-m", "hydra.sweep.dir={file}/a/sweep"], "is under"),
    (["hydra.run.dir=/proc/harness/run"], "cannot be written"),
    (["hydra.run.dir=/dev/null/run"], "character device"),
    (["cache_dir={file}"], "is a file"),
    (["cache_dir={file}/cache"], "is under"),
    (["cache_dir=/proc/harness-cache"], "cannot be written"),
    (["cache_dir=/sys/harness-cache"], "cannot be written"),
    (["cache_dir=/dev/null"], "character device"),
    (["cache_dir={tmp}/fifo.db"], "FIFO"),
    (["tracking.uri=sqlite:///{foreign}"], "not an MLflow store"),
    (["tracking.uri=sqlite:///{text}"], "not a SQLite database"),
    (["tracking.uri=sqlite:///{fifo}"], "FIFO"),
    (["tracking.uri=sqlite:///{file}"], "not a SQLite database"),
]


def with_outputs(argv: list[str], tmp: Path) -> list[str]:
    """Output locations inside tmp for every case that does not set its own."""
    keys = {a.split("=", 1)[0] for a in argv}
    extra = [] if "hydra.run.dir" in keys else [f"hydra.run.dir={tmp}/runs/one"]
    extra += [] if "hydra.sweep.dir" in keys else [f"hydra.sweep.dir={tmp}/runs/sweep"]
    extra += [] if "cache_dir" in keys else [f"cache_dir={tmp}/cache"]
    return [*extra, *argv]


@pytest.mark.parametrize(("argv", "needle"), PRECHECK, ids=[" ".join(a) for a, _ in PRECHECK])
def test_the_command_line_is_refused_in_one_line(argv, needle, tmp_path):
    files = store_files(tmp_path)
    before = first.snapshot(tmp_path)
    refused(precheck, needle, with_outputs(["model=tiny", *(a.format(**files) for a in argv)], tmp_path))
    assert first.snapshot(tmp_path) == before


def test_a_glob_sweep_is_expanded_to_the_group_options(tmp_path):
    argv = precheck(with_outputs(["-m", "model=tiny", "system=glob(tide*)"], tmp_path))
    assert "system=tide,tide_adaptive,tide_sequential" in argv


def test_a_huge_range_is_counted_not_enumerated(tmp_path):
    """Accepted with sweep.max_jobs, checked at its ends, and sweep.max_jobs is not passed to Hydra."""
    argv = precheck(with_outputs(["-m", "model=tiny", "decode.seed=range(0,100000000)",
                                  "sweep.max_jobs=100000000"], tmp_path))
    assert "decode.seed=range(0,100000000)" in argv and not any("max_jobs" in a for a in argv)
    refused(precheck, "decode.seed", with_outputs(["-m", "model=tiny", "decode.seed=range(0,2**64)"], tmp_path))


def test_a_store_that_is_empty_or_disabled_is_accepted(tmp_path):
    files = store_files(tmp_path)
    (tmp_path / "empty.db").write_bytes(b"")
    precheck(with_outputs(["model=tiny", f"tracking.uri=sqlite:///{tmp_path}/empty.db"], tmp_path))
    precheck(with_outputs(["model=tiny", "tracking.enabled=false", f"tracking.uri=sqlite:///{files['foreign']}"],
                          tmp_path))
    with contextlib.closing(sqlite3.connect(files["foreign"])) as db:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type = 'table'")}
    assert tables == {"users"}  # MLflow added nothing


# ---------------------------------------------------------------- the tools


def _train(*args: str):
    from harness.train import main

    return main, list(args)


def _bench(*args: str):
    from harness.bench import main

    return main, list(args)


def _analyze(*args: str):
    from harness.analyze import main

    return main, list(args)


def _report(*args: str):
    from harness.report.tables import main

    return main, list(args)


def _push(*args: str):
    from harness.job.mlflow_log import main

    return main, ["push", *args]


TOOLS = {
    "train seed=-1": (_train("model=tiny", "seed=-1", "cache_dir={tmp}/c"), "seed="),
    "train seed=abc": (_train("model=tiny", "seed=abc", "cache_dir={tmp}/c"), "seed="),
    "train seed=²": (_train("model=tiny", "seed=²", "cache_dir={tmp}/c"), "seed="),
    "train seed=2**64": (_train("model=tiny", "seed=18446744073709551616", "cache_dir={tmp}/c"), "seed="),
    "train sample=maybe": (_train("model=tiny", "sample=maybe", "cache_dir={tmp}/c"), "sample="),
    "train sample=": (_train("model=tiny", "sample=", "cache_dir={tmp}/c"), "sample="),
    "train cache_dir a file": (_train("model=tiny", "cache_dir={file}"), "is under"),
    "train cache_dir under /proc": (_train("model=tiny", "cache_dir=/proc/harness"), "cannot be written"),
    "train cache_dir /dev/null": (_train("model=tiny", "cache_dir=/dev/null"), "character device"),
    "train recipe=tpu": (_train("model=tiny", "recipe=tpu", "cache_dir={tmp}/c"), "recipe="),
    "bench steps=²": (_bench("steps=²"), "steps="),
    "bench tokens=٣": (_bench("tokens=٣"), "tokens="),
    "bench repeats=¹": (_bench("repeats=¹"), "repeats="),
    "bench steps=1e3": (_bench("steps=1e3"), "steps="),
    "analyze out under a file": (_analyze("trace={trace}", "out={file}/x"), "is under"),
    "analyze out under /proc": (_analyze("trace={trace}", "out=/proc/harness"), "cannot be written"),
    "analyze out /dev/null": (_analyze("trace={trace}", "out=/dev/null"), "out="),
    "report --out under /proc": (_report("--runs", "{tmp}", "--out", "/proc/harness"), "cannot be written"),
    "report --out under a file": (_report("--runs", "{tmp}", "--out", "{file}/r"), "is under"),
    "report foreign SQLite": (_report("--from-mlflow", "sqlite:///{foreign}"), "not an MLflow store"),
    "report text file as SQLite": (_report("--from-mlflow", "sqlite:///{text}"), "not a SQLite database"),
    "report FIFO as SQLite": (_report("--from-mlflow", "sqlite:///{fifo}"), "FIFO"),
    "push foreign SQLite": (_push("{tmp}/runs", "--uri", "sqlite:///{foreign}"), "not an MLflow store"),
    "push FIFO as SQLite": (_push("{tmp}/runs", "--uri", "sqlite:///{fifo}"), "FIFO"),
    "push result.json not JSON": (_push("{tmp}/bad/notjson", "--uri", "sqlite:///{tmp}/new.db"), "not a readable"),
    "push result.json a list": (_push("{tmp}/bad/list", "--uri", "sqlite:///{tmp}/new.db"), "not a readable"),
    "push result.json truncated": (_push("{tmp}/bad/cut", "--uri", "sqlite:///{tmp}/new.db"), "not a readable"),
    "push result.json a FIFO": (_push("{tmp}/bad/fifo", "--uri", "sqlite:///{tmp}/new.db"), "FIFO"),
}


def tool_files(tmp: Path) -> dict[str, str]:
    files = store_files(tmp)
    files["trace"] = str(first.tiny_trace().save(tmp / "t.npz"))
    first.write_earlier_result(tmp / "runs" / "a")
    for name, content in {"notjson": "{nope", "list": "[1, 2]", "cut": '{"schema": 1, "metr'}.items():
        (tmp / "bad" / name).mkdir(parents=True)
        (tmp / "bad" / name / "result.json").write_text(content)
    cases.make_special(tmp / "bad" / "fifo" / "result.json", "fifo")
    return files


@pytest.mark.parametrize("name", list(TOOLS))
def test_a_tool_refuses_in_one_line(name, tmp_path):
    (main, args), needle = TOOLS[name]
    files = tool_files(tmp_path)
    before = first.snapshot(tmp_path)
    first.expect_tool_error(main, [a.format(**files) for a in args], needle)
    assert first.snapshot(tmp_path) == before and not (tmp_path / "new.db").exists()


def test_a_server_answering_garbage_is_named_without_its_bytes():
    from harness.tracking.mlflow_store import TrackingUnavailable, _probe_http

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(1024)
        conn.sendall(b"\x00\x01garbage-bytes\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    with pytest.raises(TrackingUnavailable) as info:
        _probe_http(f"http://127.0.0.1:{server.getsockname()[1]}", 5)
    server.close()
    assert "not with HTTP" in str(info.value) and "garbage" not in str(info.value)


# ---------------------------------------------------------------- writes that fail mid-run


def fail_at(monkeypatch, where: str, code: int) -> None:
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    target = {"fsync": (results.os, "fsync"), "replace": (results.os, "replace"),
              "mkstemp": (results.tempfile, "mkstemp"), "mkdir": (Path, "mkdir")}[where]
    monkeypatch.setattr(*target, fail)


WRITE_FAILURES = [(w, c) for w in ("fsync", "replace", "mkstemp") for c in (errno.ENOSPC, errno.EROFS, errno.EDQUOT)]
WRITE_FAILURES += [("mkdir", errno.EACCES), ("mkdir", errno.EROFS)]


@pytest.mark.parametrize(("where", "code"), WRITE_FAILURES,
                         ids=[f"{w} {errno.errorcode[c]}" for w, c in WRITE_FAILURES])
def test_a_failed_write_is_one_line_and_keeps_the_old_file(where, code, tmp_path, monkeypatch):
    target = tmp_path / ("new" if where == "mkdir" else "") / "result.json"
    if where != "mkdir":
        target.write_text('{"old": true}')
    before = first.snapshot(tmp_path)
    fail_at(monkeypatch, where, code)
    text = refused(results.write_json_atomic, str(target.name), target, {"new": True})
    assert os.strerror(code) in text
    monkeypatch.undo()
    assert first.snapshot(tmp_path) == before  # the old file, and no temporary file left


def test_an_oserror_of_a_full_disk_from_any_writer_is_an_output_error():
    converted = as_output_error(OSError(errno.ENOSPC, "No space left on device", "/x/plot.png"))
    assert isinstance(converted, OutputError) and "/x/plot.png" in str(converted)
    other = OSError(errno.EINVAL, "Invalid argument")
    assert as_output_error(other) is other  # not a place problem: a bug, shown as one


@pytest.mark.parametrize(("raised", "code", "needle"), [
    (KeyboardInterrupt(), 130, "interrupted"),
    (OSError(errno.ENOSPC, "No space left on device", "/out/stability.png"), 2, "/out/stability.png"),
    (OSError(errno.EROFS, "Read-only file system", "/out/report.md"), 2, "Read-only"),
])
def test_a_tool_interrupted_or_out_of_space_ends_in_one_line(raised, code, needle):
    def main(argv: list[str]) -> int:
        raise raised
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        exit_with(main, [])
    lines = err.getvalue().splitlines()
    assert info.value.code == code and len(lines) == 1 and needle in lines[0], err.getvalue()


def test_ctrl_c_in_a_run_or_sweep_is_one_line_and_130(monkeypatch):
    import harness.__main__ as entry_point

    monkeypatch.setattr(entry_point, "precheck", lambda argv: argv)
    monkeypatch.setattr(entry_point, "main", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.setattr("sys.argv", ["harness", "model=tiny"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        entry_point.entry()
    assert info.value.code == 130 and len(err.getvalue().splitlines()) == 1
    assert err.getvalue().startswith("interrupted: ") and "Traceback" not in err.getvalue()


# ---------------------------------------------------------------- a real full and read-only file system


@contextlib.contextmanager
def tmpfs(where: Path, options: str):
    """A tiny tmpfs mounted at `where` (needs root and mount permission; else the test skips)."""
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()[:100]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def fill(directory: Path) -> None:
    with contextlib.suppress(OSError), (directory / "filler").open("wb", buffering=0) as f:
        while True:
            f.write(bytes(4096))


def test_a_full_file_system_is_found_at_the_start_and_mid_run(tmp_path):
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        (disk / "result.json").write_text('{"old": true}')
        fill(disk)
        text = refused(probe_output_dir, "No space left", disk / "runs", "hydra.run.dir")
        assert "hydra.run.dir" in text
        refused(results.write_json_atomic, "No space left", disk / "result.json", {"new": "x" * 100_000})
        assert (disk / "result.json").read_text() == '{"old": true}'
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "result.json", "runs"]


def test_a_read_only_file_system_is_found_at_the_start(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=64k") as disk:
        refused(probe_output_dir, "Read-only file system", disk / "cache", "cache_dir")
        refused(precheck, "Read-only file system", ["model=tiny", f"cache_dir={disk}/cache",
                                                    f"hydra.run.dir={tmp_path}/run"])


# ---------------------------------------------------------------- a resume in a new sweep dir


def test_a_resume_in_a_new_dir_ends_the_parent_it_supersedes(tmp_path):
    """The killed sweep's parent (RUNNING: SIGKILL gave it no chance) ends KILLED, tagged
    superseded, once a sweep resumed elsewhere reused its results; a FINISHED one is left alone."""
    from mlflow import MlflowClient

    from harness.job.mlflow_log import TrackingConfig
    from harness.tracking import sweep_run
    from tests.harness_cli import empty_store, sqlite_uri

    settings = TrackingConfig(uri=sqlite_uri(empty_store(tmp_path / "mlflow.db")))
    old, done, new = tmp_path / "old", tmp_path / "done", tmp_path / "new"
    ids = {}
    for sweep in (old, done, new):
        (sweep / "0").mkdir(parents=True)
        (sweep / "multirun.yaml").write_text("hydra: {}\n")
        (sweep / "0" / "result.json").write_text("{}")
        ids[sweep.name] = sweep_run.start_parent_run(settings, sweep, {"tiny"}, ["system=a,b"])
    sweep_run.end_parent_run(settings, ids["done"], "FINISHED", "finished")
    reused = [old / "0" / "result.json", done / "0" / "result.json", new / "0" / "result.json"]
    assert sweep_run.end_superseded_parents(settings, new, ids["new"], reused) == [ids["old"]]
    client = MlflowClient(tracking_uri=settings.uri)
    run = client.get_run(ids["old"])
    assert run.info.status == "KILLED" and run.data.tags[sweep_run.ENDED_TAG] == "superseded"
    assert run.data.tags["harness.superseded_by"] == ids["new"]
    assert client.get_run(ids["done"]).info.status == "FINISHED"
    assert client.get_run(ids["new"]).info.status == "RUNNING"


def test_an_unknown_experiment_is_named_not_reported_as_no_runs(tmp_path):
    from harness.report.tables import main
    from tests.harness_cli import empty_store, sqlite_uri

    store = empty_store(tmp_path / "mlflow.db")
    first.expect_tool_error(main, ["--from-mlflow", sqlite_uri(store), "--experiment", "nope", "--out",
                                   str(tmp_path / "out")], "--experiment nope: no such experiment")
    assert not (tmp_path / "out").exists()
