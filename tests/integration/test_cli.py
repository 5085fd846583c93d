"""`python -m harness` in a subprocess: a tiny run, and every kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked, precheck
from harness.common.errors import HarnessError
from harness.decode.workload import load_prompts
from tests import process_wait
from tests.bad_input_cases import tiny_unless_model
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def run_cli(*args: str, cache: Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_CACHE": str(cache)}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "harness", *args, f"hydra.run.dir={tmp / 'run'}", "tracking.enabled=false"]
    return process_wait.run(cmd, "python -m harness", cwd=REPO, env=env)


def test_tiny_run_prints_summary_and_writes_result(proxy_cache, tmp_path, tiny_dir):
    proc = run_cli("model=tiny", "decode.gen_length=8", "limit_prompts=2", cache=proxy_cache, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2 prompts" in proc.stdout and "denoising steps" in proc.stdout and "tokens/s" in proc.stdout
    assert "first prompt's output" not in proc.stdout  # random proxy weights: their text means nothing
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["weights"] == "random-proxy" and result["metrics"]["prompts"] == 2
    assert all(len(o["tokens"]) == 8 for o in result["outputs"])


# through the real command line (a subprocess each, seconds apiece): one case per kind of check
# (a config group option, a value checked against the schedule, a checkpoint that cannot load)
BAD_INPUTS = [
    (["model=nope"], "model=nope is not an option"),
    (["decode.steps=64"], "decode.steps=64 cannot serve"),
    (["model.path=/nonexistent/llada2"], "model.path"),
]
# the rest go through the same precheck in-process (what the command line calls first)
PRECHECKED = [
    (["decode.gen_length=0"], "decode.gen_length"),
    (["decode.block_length=-4"], "decode.block_length"),
    (["decode.threshold=0"], "decode.threshold"),
    (["decode.threshold=1.5"], "decode.threshold"),
    (["decode.gen_length=many"], "decode.gen_length"),
    (["decode.cache=maybe"], "decode.cache"),
    (["workload=jsonl"], "workload.path"),
]


@pytest.mark.parametrize(("args", "needle"), BAD_INPUTS, ids=[a[0] for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2(args, needle, proxy_cache, tmp_path, tiny_dir):
    proc = run_cli(*tiny_unless_model(args), cache=proxy_cache, tmp=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("args", "needle"), PRECHECKED, ids=[a[0] for a, _ in PRECHECKED])
def test_bad_input_is_refused_by_the_precheck_in_one_line(args, needle):
    with pytest.raises(HarnessError) as info:
        precheck(tiny_unless_model(args))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_bad_prompts_file(proxy_cache, tmp_path, tiny_dir):
    path = tmp_path / "prompts.jsonl"
    path.write_text("not json\n")
    proc = run_cli("model=tiny", "workload=jsonl", f"workload.path={path}", cache=proxy_cache, tmp=tmp_path)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(path) in lines[0]


@pytest.mark.parametrize("content", ["", "not json\n", '{"text": "no prompt key"}\n'])
def test_a_bad_prompts_file_is_one_line_naming_it(content, tmp_path):
    """The same file checks in-process (the subprocess above shows the exit code and the line)."""
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    cfg = compose_checked(["model=tiny", "workload=jsonl", f"workload.path={path}"])
    with pytest.raises(HarnessError) as info:
        load_prompts(cfg.workload)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_jsonl_workload_runs(proxy_cache, tmp_path, tiny_dir):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Add two numbers."}\n\n{"prompt": "Reverse a string."}\n')
    proc = run_cli("model=tiny", "workload=jsonl", f"workload.path={path}", "decode.gen_length=4",
                   cache=proxy_cache, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2 prompts" in proc.stdout
