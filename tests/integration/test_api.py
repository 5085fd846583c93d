"""The Python API (harness.run, harness.sweep, harness.report) and the commands: console
scripts, --help everywhere, and one line with the fix for each common mistake."""

from __future__ import annotations

import importlib
import json
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

import harness
import harness.report.plots as report_plots  # the callable package's modules stay modules
from harness.cli.overrides import precheck
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.results.run_result import RunResult
from tests import process_wait
from tests.bad_input_cases import tiny_unless_model
from tests.harness_cli import REPO, TINY, empty_store, harness_env, sqlite_uri

register_configs()


def tiny(cache: Path, *extra: str) -> list[str]:
    return [*TINY, f"cache_dir={cache}", *extra]


def test_harness_run_from_python(proxy_cache: Path, tiny_dir: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture) -> None:
    store = sqlite_uri(empty_store(tmp_path / "mlflow.db"))
    result = harness.run(tiny(proxy_cache, "system=fiddler", f"tracking.uri={store}"), run_dir=tmp_path / "run")
    assert isinstance(result, RunResult) and result.run_dir == tmp_path / "run"
    on_disk = json.loads((tmp_path / "run" / "result.json").read_text())
    assert on_disk["system"] == "fiddler" and on_disk["metrics"]["prompts"] == 1
    assert result.flat_metrics()["tokens_per_s"] == on_disk["metrics"]["tokens_per_s"]
    assert on_disk["started_at"] <= on_disk["finished_at"]
    out = capsys.readouterr().out
    assert f"result: {(tmp_path / 'run' / 'result.json').resolve()}" in out
    assert "MLflow run: http://127.0.0.1:5000/#/experiments/" in out


def test_harness_run_refuses_bad_input_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"budget=custom budget.gpu_gb=12"):
        harness.run(["model=tiny", "budget=12GB"], run_dir=tmp_path)
    with pytest.raises(HarnessError, match=r"add -m"):
        harness.run(["model=tiny", "system=tide,fiddler"], run_dir=tmp_path)
    with pytest.raises(HarnessError, match="internal schema"):
        harness.run(["model=tiny", "system=tide_schema"], run_dir=tmp_path)
    assert not (tmp_path / "result.json").exists()


def test_harness_report_is_callable_and_returns_the_table(tmp_path: Path) -> None:
    from tests.unit.test_report_keys import base_result, write_runs

    runs = write_runs(tmp_path / "runs", [base_result("tide", 100.0), base_result("fiddler", 50.0)])
    wide = harness.report(runs, out=tmp_path / "report", quiet=True)
    assert isinstance(wide, pd.DataFrame) and wide[("tide", "speedup")].tolist() == [2.0]
    assert (tmp_path / "report" / "report_long.csv").is_file()
    assert callable(harness.report) and report_plots.DPI == 300 and harness.report.plots is report_plots
    with pytest.raises(HarnessError, match="no such directory"):
        harness.report(tmp_path / "none", out=tmp_path / "o")


@pytest.mark.slow
def test_harness_sweep_from_python(proxy_cache: Path, tiny_dir: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CACHE", str(proxy_cache))
    monkeypatch.chdir(REPO)
    results = harness.sweep([*TINY, "system=gpu_only,fiddler", "tracking.enabled=false"],
                            sweep_dir=tmp_path / "sweep", quiet=True)
    assert [r.identity.system for r in results] == ["gpu_only", "fiddler"]
    assert [r.run_dir.name for r in results] == ["0", "1"]


# ------------------------------------------------------------------ commands


def test_every_console_script_is_a_callable() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"harness", "harness-report", "harness-analyze", "harness-bench", "harness-train"} <= set(scripts)
    for target in scripts.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), target


HELP = [
    ("harness.__main__", "entry", [], "config groups"),
    ("harness.analyze", "cli", [], "trace=<...>"),
    ("harness.bench", "cli", [], "systems=<...>"),
    ("harness.train", "cli", [], "model=<...>"),
    ("harness.report.tables", "main", [], "runs=DIR"),
    ("harness.job.mlflow_log", "main", ["push"], "uri=URI"),
]


@pytest.mark.parametrize(("module", "name", "before", "needle"), HELP, ids=[h[0] for h in HELP])
def test_every_command_answers_help(module: str, name: str, before: list[str], needle: str,
                                    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "argv", [module, *before, "--help"])
    function = getattr(importlib.import_module(module), name)
    with pytest.raises(SystemExit) as exited:
        function(*([[*before, "--help"]] if name == "main" else []))
    assert exited.value.code in (0, None)
    assert needle in capsys.readouterr().out


def test_harness_help_lists_every_group_and_option_and_hides_schemas(capsys: pytest.CaptureFixture) -> None:
    from harness.cli.help import help_text
    from harness.cli.hints import group_options, groups

    text = help_text()
    for group in groups():
        assert f"  {group}=<option>" in text
        for option in group_options(group):
            line = next(ln for ln in text.splitlines() if ln.strip().startswith(option + " ") or ln.strip() == option)
            assert len(line.strip().split(maxsplit=1)) == 2, f"{group}/{option} has no description"
    assert "_schema" not in text
    assert "timing.repeats=3" in text and "budget.gpu_gb" in text


MISTAKES = [
    (["system=tide_schema"], "internal schema, not an option"),
    (["system=tdie"], "did you mean tide?"),
    (["budget=12GB"], "use budget=custom budget.gpu_gb=12"),
    (["experiment=table1"], "write +experiment=table1"),
    (["system=tide,fiddler"], "add -m"),
    (["decode.gen_lenght=8"], "did you mean gen_length?"),
]


@pytest.mark.parametrize(("args", "fix"), MISTAKES, ids=[m[0][0] for m in MISTAKES])
def test_each_common_mistake_names_its_fix(args: list[str], fix: str) -> None:
    with pytest.raises(HarnessError, match=fix.replace("?", r"\?").replace("+", r"\+")):
        precheck(tiny_unless_model(args))


def test_a_quoted_comma_and_a_sweep_with_m_are_fine() -> None:
    precheck(["-m", "model=tiny", "system=tide,fiddler"])
    precheck(["model=tiny", "workload.prompts=['a,b']"])


@pytest.mark.slow
@pytest.mark.parametrize(("args", "fix"), MISTAKES[:5], ids=[m[0][0] for m in MISTAKES[:5]])
def test_the_command_line_answers_each_mistake_with_one_line_and_exit_2(args: list[str], fix: str,
                                                                        tmp_path: Path) -> None:
    proc = process_wait.run([sys.executable, "-m", "harness", *tiny_unless_model(args)], "python -m harness", cwd=REPO,
                            env=harness_env(tmp_path))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and fix in lines[0], proc.stderr
