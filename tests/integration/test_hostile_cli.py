"""Hostile input rounds two and three through the real command line: Hydra's own usage
errors as one line and exit 2, a glob sweep that runs, Ctrl-C in a sweep as one line and
exit 130 with the parent run ended, a full disk under the run dir and under .hydra, a sweep
whose second job fails, and round three's catalogue (tests/hostile_cases.py ROUND_THREE),
each with its one line and exit code. Subprocesses: the slow tier."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import process_wait
from tests.harness_cli import (
    REPO,
    TINY,
    empty_store,
    harness_env,
    parent_and_children,
    run_module,
    sqlite_uri,
    tiny_with,
)
from tests.hostile_cases import ROUND_THREE, round_three_files
from tests.unit.test_sensitivity import small_sweep

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("args", "needle"), [
    (["--frobnicate"], "--frobnicate"),
    (["--config-name", "nope"], "no such config"),
    (["-m", "model=tiny", "system=glob(nothing*)"], "matches no option"),
    (["-m", "model=tiny", "decode.seed=range(0,100000000)"], "100,000,000 jobs"),
])
def test_usage_errors_are_one_line_and_exit_2(args, needle, proxy_cache, tmp_path):
    proc = run_module("harness", args, proxy_cache)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_glob_sweep_runs(proxy_cache, tiny_dir, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_module("harness", ["-m", *TINY, "system=glob(gpu*)", "tracking.enabled=false",
                                  f"hydra.sweep.dir={sweep}"], proxy_cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (sweep / "0" / "result.json").is_file() and not (sweep / "1").exists()


def test_ctrl_c_in_a_sweep_is_one_line_exit_130_and_the_parent_ends_killed(proxy_cache, tiny_dir, tmp_path):
    store = empty_store(tmp_path / "mlflow.db")
    sweep = tmp_path / "sweep"
    # job 0 decodes one prompt, job 1 eight to the end (no EOS stop): the Ctrl-C must land while
    # the sweep still runs, also on a loaded machine (with three quick jobs, CI once saw the sweep
    # finish before the signal arrived: exit 0, nothing to test)
    args = [sys.executable, "-m", "harness", "-m", *tiny_with("decode.gen_length=512", "limit_prompts=1,8"),
            "decode.eos_early_stop=false", "budget=55GB", "system=gpu_only", f"tracking.uri={sqlite_uri(store)}",
            f"hydra.sweep.dir={sweep}"]
    proc = process_wait.start(args, cwd=REPO, env=harness_env(proxy_cache), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        process_wait.wait_until((sweep / "0" / "result.json").is_file, proc, "the sweep's first result")
        proc.send_signal(signal.SIGINT)
        _, err = process_wait.finish(proc, "the sweep after Ctrl-C")
    finally:
        if proc.poll() is None:
            process_wait.kill_tree(proc)
    lines = [ln for ln in err.splitlines() if ln.strip() and "%|" not in ln]  # the progress bars aside
    assert proc.returncode == 130, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("interrupted: ") and "resume=true" in lines[0], err[-3000:]
    parents, _ = parent_and_children(store)
    assert [p.info.status for p in parents] == ["KILLED"]
    assert (sweep / "0" / "result.json").is_file() and not list(sweep.rglob(".*.tmp"))
    assert not (sweep / "1" / "result.json").exists()  # the signal came while job 1 ran


def test_a_full_disk_mid_run_is_one_line_naming_what_was_saved(proxy_cache, tiny_dir, tmp_path):
    """The run dir on a tmpfs with 7 inodes (root only; else skipped): the precheck's probe and
    Hydra's files fit, result.json does not. One error line, exit 2, naming the file and what
    the run dir holds; the progress bar aside, nothing else on stderr."""
    from tests.unit.test_hostile_options import tmpfs

    with tmpfs(tmp_path / "disk", "size=1m,nr_inodes=7") as disk:
        run_dir = disk / "run"
        run_dir.mkdir()
        proc = run_module("harness", [*TINY, "system=gpu_only", "tracking.enabled=false", f"hydra.run.dir={run_dir}"],
                          proxy_cache)
        left = sorted(p.name for p in run_dir.iterdir())
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "%|" not in ln]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith(f"error: cannot write {run_dir / 'result.json'} (No space left on device)")
    assert lines[0].endswith(f"saved in {run_dir}: __main__.log") and left == [".hydra", "__main__.log"]


def test_a_full_disk_while_hydra_writes_its_config_is_one_line(proxy_cache, tiny_dir, tmp_path):
    """The run dir on a tmpfs with 4 inodes (root only; else skipped): the precheck's probe
    fits, Hydra's .hydra/config.yaml does not. One error line naming it, exit 2 (Hydra's own
    handler printed a 7-line traceback)."""
    from tests.unit.test_hostile_options import tmpfs

    with tmpfs(tmp_path / "disk", "size=1m,nr_inodes=4") as disk:
        run_dir = disk / "run"
        run_dir.mkdir()
        proc = run_module("harness", [*TINY, "system=gpu_only", "tracking.enabled=false", f"hydra.run.dir={run_dir}"],
                          proxy_cache)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith(f"error: cannot write {run_dir / '.hydra' / 'config.yaml'} (No space left on device)")


def test_a_sweep_whose_second_job_fails_ends_with_one_line_per_failed_job(proxy_cache, tiny_dir, tmp_path):
    """Job 1 reads a prompts file with a lone surrogate (found only by the run): its error is
    one `[failed]` line as it ends and one in the short summary, nothing on stderr but the
    progress bars, exit 2; the table is in its file, not printed."""
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text('{"prompt": "def f(x):"}\n')
    bad.write_bytes(b'{"prompt": "ok \\ud800"}\n')
    sweep = tmp_path / "sweep"
    proc = run_module("harness", ["-m", *TINY, "tracking.enabled=false", "workload=jsonl",
                                  f"workload.path={good},{bad}", f"hydra.sweep.dir={sweep}"], proxy_cache)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.strip() and "%|" not in ln] == []
    summary = proc.stdout[proc.stdout.index("sweep summary"):].splitlines()
    assert summary[0] == f"sweep summary ({sweep}): 1 of 2 jobs done, 1 failed; the table: {sweep / 'sweep_summary.md'}"
    assert len(summary) == 2 and summary[1].startswith("[failed] #1: ") and "invalid Unicode" in summary[1]
    assert proc.stdout.count("[failed] #1:") == 2 and (sweep / "sweep_summary.md").is_file()


def test_a_sweep_resumed_in_a_new_dir_ends_the_killed_sweeps_parent(proxy_cache, tiny_dir, tmp_path):
    """SIGKILL leaves the first sweep's parent RUNNING; resume=true in another dir reuses its
    result and ends that parent KILLED (superseded)."""
    store = empty_store(tmp_path / "mlflow.db")
    cache = tmp_path / "cache"  # its own resume index: only this test's results are reused
    (cache / "results").mkdir(parents=True)
    (cache / "proxies").symlink_to(proxy_cache / "proxies")
    common = ["-m", *tiny_with("decode.gen_length=8"), "budget=55GB", "system=gpu_only,fiddler,mixtral_offload",
              f"tracking.uri={sqlite_uri(store)}", f"cache_dir={cache}"]
    old = tmp_path / "old"
    proc = process_wait.start([sys.executable, "-m", "harness", *common, f"hydra.sweep.dir={old}"], cwd=REPO,
                              env=harness_env(proxy_cache), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # a finished job, indexed for resume
        process_wait.wait_until(lambda: any((cache / "results").glob("*.json")), proc, "the first indexed result")
    finally:
        process_wait.kill_tree(proc)
    [killed] = parent_and_children(store)[0]
    assert killed.info.status == "RUNNING"
    resumed = run_module("harness", [*common, "resume=true", f"hydra.sweep.dir={tmp_path / 'new'}"], proxy_cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    parents = {p.info.run_id: p for p in parent_and_children(store)[0]}
    assert parents[killed.info.run_id].info.status == "KILLED"
    assert parents[killed.info.run_id].data.tags["harness.ended"] == "superseded"
    assert [p.info.status for i, p in parents.items() if i != killed.info.run_id] == ["FINISHED"]


def _spawned_workers(pid: int) -> list[int]:
    """The multiprocessing workers among a process's children (not its resource tracker)."""
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline")
        if cmdline.exists() and b"spawn_main" in cmdline.read_bytes():
            found.append(int(child))
    return found


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ")[-1].startswith("Z")


def test_ctrl_c_during_a_parallel_sensitivity_ends_its_workers(proxy_cache, tiny_dir, tmp_path):
    """Ctrl-C while two workers start: one line, exit 130, no worker left running and nothing
    written (SIGTERM takes the same way out as SystemExit(143): tests/unit/test_sensitivity.py)."""
    sig, code, line = signal.SIGINT, 130, "interrupted:"
    sweep, out = small_sweep(tmp_path, proxy_cache), tmp_path / "out"
    proc = process_wait.start([sys.executable, "-m", "harness.sensitivity", f"sweep={sweep}", f"out={out}",
                               "jobs=2", "tracking=false"], cwd=REPO, env=harness_env(proxy_cache),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # signalled while the workers start (importing torch takes seconds)
        process_wait.wait_until(lambda: len(_spawned_workers(proc.pid)) >= 2, proc, "two sensitivity workers")
        workers = _spawned_workers(proc.pid)
        proc.send_signal(sig)
        _, err = process_wait.finish(proc, "the sensitivity after Ctrl-C")
    finally:
        if proc.poll() is None:
            process_wait.kill_tree(proc)
    assert proc.returncode == code, err[-2000:]
    assert any(ln.startswith(line) for ln in err.splitlines()) and "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 60  # they end with their parent; the ceiling only catches one left running
    while not all(_gone(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(w) for w in workers)
    assert not out.exists()


CTRL_C_WHILE_THE_SECOND_WORKER_STARTS = """
import multiprocessing.context, sys
from harness.common.workers import in_workers

started = []
real_start = multiprocessing.context.SpawnProcess.start

def start(self):  # Ctrl-C lands while the second worker starts
    started.append(self)
    if len(started) == 2:
        raise KeyboardInterrupt
    real_start(self)

multiprocessing.context.SpawnProcess.start = start
try:  # two pieces of 300 kB: more than the tasks' pipe holds, so its feeder blocks without a reader
    in_workers([b"x" * 300_000, b"y" * 300_000], len, 2, name="sensitivity", unit="cell")
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_while_the_sensitivity_workers_start_does_not_hang_the_exit(tmp_path):
    """CI once saw the parent hang after its `interrupted:` line: the Ctrl-C came before the
    worker loop's `finally`, so the first worker stayed and the tasks' feeder waited at exit."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_WHILE_THE_SECOND_WORKER_STARTS)
    proc = process_wait.start([sys.executable, str(script)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process_wait.finish(proc, "the worker loop after Ctrl-C")
    finally:
        if proc.poll() is None:
            process_wait.kill_tree(proc)
    assert proc.returncode == 130 and out.strip() == "interrupted", err[-2000:]


@pytest.fixture(scope="module")
def round_three(proxy_cache, tiny_dir, tmp_path_factory):
    return round_three_files(tmp_path_factory.mktemp("round3"), tiny_dir)


@pytest.mark.parametrize("name", list(ROUND_THREE))
def test_round_three_catalogue_is_one_line_with_its_exit_code(name, round_three, proxy_cache):
    module, args, needle, code = ROUND_THREE[name]
    proc = run_module(module, [a.format(**round_three) for a in args], proxy_cache)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "%|" not in ln]
    assert proc.returncode == code and len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
    assert lines[0].startswith("error: " if code == 2 else "warning: ") and "Traceback" not in proc.stderr
