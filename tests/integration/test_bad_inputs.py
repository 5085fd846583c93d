"""Catalogue of hostile inputs (docs/bad-input.md): every one is a one-line HarnessError (exit 2 on the
command line), never a traceback or a silent accept, and nothing already written changes.

Most cases call the validating entry point in-process (the command-line precheck, run_job,
the loaders, each tool's main); a representative subset runs as subprocesses. The
checkpoint, trace, prompt-file and tool cases live in tests/bad_input_cases.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli.overrides import compose_checked, precheck
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.job.live import run_job
from tests import bad_input_cases as cases
from tests.harness_cli import run_module

register_configs()

# ---------------------------------------------------------------- config values (precheck)

CONFIG = [
    (["budget=custom", "budget.gpu_gb=inf"], "budget.gpu_gb"),
    (["budget=custom", "budget.gpu_gb=1e308"], "budget.gpu_gb"),
    (["budget=custom", "budget.gpu_gb=1e400"], "budget.gpu_gb"),
    (["budget=custom", "budget.gpu_gb=nan"], "budget.gpu_gb"),
    (["budget=custom", "budget.gpu_gb=-1"], "budget.gpu_gb"),
    (["budget.reserve_gb=nan"], "budget.reserve_gb"),
    (["budget.reserve_gb=-0.5"], "budget.reserve_gb"),
    (["budget.reserve_gb=inf"], "budget.reserve_gb"),
    (["budget.gpu_gb=12,inf,13"], "budget.gpu_gb"),  # one bad value in a sweep stops it before it starts
    (["decode.gen_length=10000000000000"], "decode.gen_length"),
    (["model=mini", "decode.gen_length=100000"], "32768 positions"),
    (["decode.gen_length=0"], "decode.gen_length"),
    (["decode.gen_length=-3"], "decode.gen_length"),
    (["decode.gen_length=abc"], "decode.gen_length"),
    (["decode.gen_length=[1,2"], "decode.gen_length"),
    (["decode.block_length=0"], "decode.block_length"),
    (["decode.block_length=100000", "decode.steps=8"], "decode.block_length"),
    (["decode.steps=0"], "decode.steps"),
    (["decode.steps=64"], "decode.steps"),
    (["decode.temperature=inf"], "decode.temperature"),
    (["decode.temperature=nan"], "decode.temperature"),
    (["decode.temperature=-1"], "decode.temperature"),
    (["decode.threshold=nan"], "decode.threshold"),
    (["decode.threshold=0"], "decode.threshold"),
    (["decode.threshold=1.5"], "decode.threshold"),
    (["decode.seed=-1"], "decode.seed"),
    (["decode.seed=99999999999999999999"], "decode.seed"),
    (["decode.cache=maybe"], "decode.cache"),
    (["model=nope"], "model=nope"),
    (["model.dtype=int8"], "model.dtype"),
    (["limit_prompts=0"], "limit_prompts"),
    (["source=disk"], "source"),
    (["backend=tpu"], "backend"),
    (["unknown_key=1"], "unknown_key"),
    (["hardware.pcie_gbps=inf"], "hardware.pcie_gbps"),
    (["hardware.pcie_gbps=0"], "hardware.pcie_gbps"),
    (["hardware.pcie_latency_us=nan"], "hardware.pcie_latency_us"),
    (["system.tau=-3"], "system.tau"),
    (["system.tau=abc"], "system.tau"),
    (["system=mixtral_offload", "system.prefetch=maybe"], "system.prefetch"),
    (["topology=multi"], "topology"),
    (["tracking.uri=foo://bar"], "tracking.uri"),
    (["tracking.uri=mlruns"], "tracking.uri"),
    (["tracking.uri=http://:5000"], "tracking.uri"),
    (["tracking.uri=http://host:99999"], "tracking.uri"),
    (["tracking.uri=sqlite://relative.db"], "tracking.uri"),
    (["tracking.timeout_s=0"], "tracking.timeout_s"),
    (["tracking.timeout_s=inf"], "tracking.timeout_s"),
    (["tracking=false"], "set one, e.g. tracking.enabled=false"),  # a node of settings given one value
    (["decode=8"], "'decode' is a config group: choose one of its options (default, paper)"),  # was a traceback
]


def assert_one_line(exc: HarnessError, needle: str) -> None:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text, text
    assert needle in text, text


@pytest.mark.parametrize(("overrides", "needle"), CONFIG, ids=[" ".join(o) for o, _ in CONFIG])
def test_bad_config_value_is_refused_before_the_run(overrides, needle):
    with pytest.raises(HarnessError) as info:
        precheck(cases.tiny_unless_model(overrides))
    assert_one_line(info.value, needle)


def test_a_good_config_passes_the_same_checks():
    precheck(["model=tiny", "decode.temperature=0.5", "tracking.uri=http://host:5000", "system.tau=4"])


def test_unparsable_override_names_its_key():
    with pytest.raises(HarnessError, match=r"key decode\.gen_length"):
        precheck(["model=tiny", "decode.gen_length=[1,2"])


# ---------------------------------------------------------------- run-time inputs (run_job)

TINY = ["model=tiny", "decode.gen_length=4", "decode.block_length=4", "decode.steps=2", "limit_prompts=1",
        "show_text=false", "tracking.enabled=false"]


def run_and_expect(overrides: list[str], cache: Path, run_dir: Path, needle: str, edit=None) -> None:
    """Composing the typed config or run_job fails with a one-line HarnessError (a value
    the config's own checks catch fails at compose time, before any work) and leaves the
    run dir's files as they were."""
    before = cases.write_earlier_result(run_dir)
    with pytest.raises(HarnessError) as info:
        cfg = compose_checked([*TINY, f"cache_dir={cache}", *overrides])
        if edit is not None:
            edit(cfg)
        run_job(cfg, run_dir)
    assert_one_line(info.value, needle)
    assert cases.snapshot(run_dir) == before


def _long_prompt(cfg) -> None:
    cfg.workload.prompts = ["\u4e00" * 12_000]  # three byte-level tokens each: 36000 > 32768 positions


RUNTIME = {
    "prompt longer than the model's positions": ([], "max_position_embeddings", _long_prompt),
    "budget.experts_per_layer=0": (["budget.experts_per_layer=0"], "budget.experts_per_layer", None),
    "budget.experts_per_layer above the experts": (["budget.experts_per_layer=100000"], "experts_per_layer", None),
    "budget below the non-expert weights": (["model=mini", "budget=custom", "budget.gpu_gb=0.6",
                                             "budget.reserve_gb=0.5"], "budget.gpu_gb", None),
}


def test_a_block_longer_than_gen_length_decodes_as_the_reference(proxy_cache, tiny_dir, tmp_path):
    """`block=64` with gen_length 16 is accepted on purpose: the reference `generate` pads the
    window to whole blocks and cuts the output at gen_length, so the harness does the same.
    What made it wrong before (75 denoising steps for 16 tokens) was the schedule: steps are
    now clamped to gen_length, so no block takes more than 16 steps."""
    cfg = compose_checked([*TINY, f"cache_dir={proxy_cache}", "decode.gen_length=16", "decode.block_length=64",
                           "decode.steps=64", "limit_prompts=2", "system=gpu_only"])
    decoded = run_job(cfg, tmp_path / "run").decoded
    assert [o["n_generated"] for o in decoded.outputs] == [16, 16]
    steps_per_block: dict[tuple[int, int], int] = {}
    for record in decoded.steps:
        if record["kind"] == "denoise":
            key = (record["prompt"], record["block"])
            steps_per_block[key] = steps_per_block.get(key, 0) + 1
    assert steps_per_block and max(steps_per_block.values()) <= 16
    assert {record["tokens_routed"] for record in decoded.steps if record["kind"] == "denoise"} == {64}


@pytest.mark.parametrize("name", list(RUNTIME))
def test_bad_run_input(name, proxy_cache, tiny_dir, tmp_path):
    overrides, needle, edit = RUNTIME[name]
    run_and_expect(overrides, proxy_cache, tmp_path / "run", needle, edit)


@pytest.mark.parametrize("name", list(cases.PROMPT_FILES))
def test_bad_prompts_file(name, proxy_cache, tiny_dir, tmp_path):
    content, needle = cases.PROMPT_FILES[name]
    path = cases.write_prompt_file(tmp_path, content)
    run_and_expect(["workload=jsonl", f"workload.path={path}"], proxy_cache, tmp_path / "run", needle)


@pytest.mark.parametrize("name", list(cases.CHECKPOINTS))
def test_bad_checkpoint_through_a_run(name, proxy_cache, tiny_dir, tmp_path):
    directory = cases.broken_checkpoint(tiny_dir, tmp_path / "ckpt", name)
    run_and_expect(["system=gpu_only", f"model.path={directory}"], proxy_cache, tmp_path / "run",
                   cases.CHECKPOINTS[name][1])


@pytest.mark.parametrize("name", list(cases.TRACES))
def test_bad_trace_through_a_replay(name, proxy_cache, tmp_path):
    path = cases.broken_trace(tmp_path / "rec", name)
    run_and_expect(["source=trace", "system=gpu_only", f"trace.path={path}"], proxy_cache, tmp_path / "run",
                   cases.TRACES[name][1])


@pytest.mark.parametrize("system", ["fiddler", "tide"])
def test_calibration_of_another_model_is_refused_by_name(system, proxy_cache, tmp_path):
    path = cases.trace_with_foreign_calibration(tmp_path / "rec")
    run_and_expect(["source=trace", f"system={system}", f"trace.path={path}"], proxy_cache, tmp_path / "run",
                   "recorded with model=mini")


# ---------------------------------------------------------------- function level: formats and tools


@pytest.mark.parametrize("name", list(cases.SHARD_HEADERS))
def test_bad_shard_header(name, tmp_path):
    path = cases.write_shard(tmp_path / "model.safetensors", *cases.SHARD_HEADERS[name][0])
    before = cases.snapshot(tmp_path)
    from harness.model.checkpoint import read_shard_header

    with pytest.raises(HarnessError) as info:
        read_shard_header(path)
    assert_one_line(info.value, cases.SHARD_HEADERS[name][1])
    assert cases.snapshot(tmp_path) == before


@pytest.mark.parametrize("name", list(cases.TOOLS))
def test_bad_tool_arguments(name, tmp_path):
    main, argv, needle = cases.tool_case(name, tmp_path)
    before = cases.snapshot(tmp_path)
    cases.expect_tool_error(main, argv, needle)
    assert cases.snapshot(tmp_path) == before


@pytest.mark.parametrize("uri", ["", " sqlite:///x.db", "foo://x", "file:///tmp/mlruns", "sqlite:///",
                                 "https://", "postgresql://"])
def test_bad_uri(uri):
    from harness.tracking.uris import check_tracking_uri

    with pytest.raises(HarnessError) as info:
        check_tracking_uri(uri, "tracking.uri")
    assert_one_line(info.value, "tracking.uri")


# ---------------------------------------------------------------- subprocesses: the real exit path

SUBPROCESS = {
    "harness budget inf": ("harness", ["model=tiny", "budget=custom", "budget.gpu_gb=inf"], "budget.gpu_gb"),
    "harness malformed override": ("harness", ["model=tiny", "decode.gen_length=[1,2"], "decode.gen_length"),
    "harness binary prompts file": ("harness", [*TINY, "workload=jsonl", "workload.path={binary}"], "UTF-8"),
    "analyze truncated trace": ("harness.analyze", ["trace={truncated}"], "corrupt"),
    "harness dali over a next_gate-only trace": ("harness", [*TINY, "source=trace", "trace.path={next_gate_only}",
                                                             "system=dali"], "system.predictor=next_gate"),
    "bench steps=abc": ("harness.bench", ["steps=abc"], "steps"),
    "report --out a file": ("harness.report", ["--out", "{file}"], "--out"),
    "push --uri garbage": ("harness.tracking", ["push", "{dir}", "--uri", "foo://x"], "--uri"),
}


@pytest.mark.parametrize("name", list(SUBPROCESS))
def test_command_line_exit_2_one_line(name, proxy_cache, tiny_dir, tmp_path):
    module, args, needle = SUBPROCESS[name]
    files = cases.command_line_files(tmp_path)
    run_dir = tmp_path / "run"
    before = cases.write_earlier_result(run_dir)
    argv = [a.format(**files) for a in args]
    if module == "harness":
        argv.append(f"hydra.run.dir={run_dir}")
    proc = run_module(module, argv, proxy_cache)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert needle in lines[0]
    assert {k: v for k, v in cases.snapshot(run_dir).items() if k in before} == before


@pytest.mark.slow
def test_a_bad_value_inside_a_sweep_fails_only_its_job(proxy_cache, tiny_dir, tmp_path):
    """A value only the run can check (a prompts file) fails that job with failed.json; the
    other job runs, the summary is written and the sweep exits 2."""
    files = cases.command_line_files(tmp_path)
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n")
    sweep = tmp_path / "sweep"
    proc = run_module("harness", ["-m", *TINY, "system=gpu_only", "workload=jsonl",
                                  f"workload.path={good},{files['binary']}", f"hydra.sweep.dir={sweep}"],
                      proxy_cache)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert (sweep / "0" / "result.json").is_file() and not (sweep / "0" / "failed.json").exists()
    assert "UTF-8" in json.loads((sweep / "1" / "failed.json").read_text())["error"]
    assert (sweep / "sweep_summary.csv").is_file()
