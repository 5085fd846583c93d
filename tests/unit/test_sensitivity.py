"""The sensitivity analysis (harness/sensitivity): its decision rules on plain numbers, a rank
flip on a hand-made trace at the CPU speed computed by hand, re-charges that equal full
replays, and the command on a small replay sweep (files, MLflow under the parent run)."""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from harness.accounting.cost import CostModel, HardwareConfig
from harness.bench import synthetic_trace
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.job.config import register_configs
from harness.job.live import run_job
from harness.model.config import LLaDA2Config
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.sensitivity.__main__ import main as sensitivity_main
from harness.sensitivity.analysis import Roles, analyse_constant, first_crossing
from harness.sensitivity.cells import analyse_cell
from harness.sensitivity.replayer import JobReplayer, JobSpec
from harness.sensitivity.scaling import scale_grid, scaled
from systems.registry import system_config

register_configs()

G = LLaDA2Config(hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3)  # 2 MoE layers, 256 experts
N = 5  # tokens per routed expert in the hand-made trace


def test_scale_grid_is_log_spaced_and_holds_one():
    grid = scale_grid(0.25, 4, 5)
    assert grid == pytest.approx([0.25, 0.5, 1.0, 2.0, 4.0])
    assert 1.0 in scale_grid(0.25, 4, 4)
    with pytest.raises(HarnessError, match="scales"):
        scale_grid(2, 4, 5)


def test_first_crossing_finds_where_two_time_curves_cross():
    """A: 1 + 3/s seconds, B: 2 seconds (s: the constant's factor); A overtakes B at s = 3."""
    def speeds(s: float) -> dict[str, float]:
        return {"a": 1 / (1 + 3 / s), "b": 1 / 2}

    roles = Roles(references=(), baselines=())
    assert roles.winner(speeds(1.0)) == "b"
    up = first_crossing(speeds, [1.5, 2.0, 4.0], lambda sp: roles.winner(sp) != "b", tolerance=0.001)
    assert 3.0 <= up.factor <= 3.0 * 1.001 and roles.winner(up.speeds) == "a"
    assert first_crossing(speeds, [0.5, 0.25], lambda sp: roles.winner(sp) != "b").factor is None


def test_margin_move_is_found_at_the_factor_computed_by_hand():
    """margin = a / b = 2 / (1 + 1/s): +10% of its 1x value (1) at 2/(1 + 1/s) = 1.1, s = 11/9."""
    def speeds(s: float) -> dict[str, float]:
        return {"a": 1 / (1 + 1 / s), "b": 0.5}

    result = analyse_constant("x", scale_grid(0.25, 4, 9), speeds, Roles(references=(), baselines=("b",)),
                              tolerance=0.001)
    assert 11 / 9 <= result.margin_up.factor <= 11 / 9 * 1.001
    assert result.margin_down.factor is not None and result.margin_down.factor < 1  # 2/(1+1/s) = 0.9 at s = 9/11
    assert 9 / 11 / 1.001 <= result.margin_down.factor <= 9 / 11
    assert result.winner_up.factor is None  # a stays ahead of b everywhere


# ---- a rank flip on a hand-made trace ---------------------------------------------------------

def hand_made_traces() -> tuple[RoutingTrace, RoutingTrace]:
    """Every layer of every forward routes N tokens to experts 0..3; the calibration makes
    experts 0 and 1 the popular ones (fiddler keeps them resident at B = 2)."""
    trace, calibration = (RoutingTrace(G.n_moe_layers, G.num_experts) for _ in range(2))
    for s in range(4):
        trace.add_step(StepInfo(0, 0, s, s, False), 16, 64)
        calibration.add_step(StepInfo(0, 0, s, s, False), 16, 64)
        for layer in range(G.n_moe_layers):
            load = torch.zeros(G.num_experts, dtype=torch.int32)
            load[:4] = N
            trace.record(layer, load)
            load = load.clone()
            load[:2] = 10 * N
            calibration.record(layer, load)
    return trace, calibration


def flip_hardware() -> HardwareConfig:
    """CPU compute-bound (no call overhead, unlimited memory bandwidth) and 4x slower than
    the GPU expert here, so that the crossing is at 2x its throughput; a link so slow that
    fiddler never copies a miss."""
    base = HardwareConfig(cpu_mem_gbps=1e9, cpu_call_overhead_us=0.0, pcie_gbps=1e-6)
    gpu = CostModel(G, base).gpu_expert_time(N)
    flops = 2.0 * G.expert_params * N
    return replace(base, cpu_tflops=flops / (4 * gpu) / 1e12)


def job(name: str, options: dict, hw: HardwareConfig, trace: RoutingTrace, calibration: RoutingTrace,
        shortcut: bool = True) -> JobReplayer:
    spec = JobSpec(system_config(name, options), G, 2, "per_layer", hw, trace, calibration, 8, 64)
    return JobReplayer(spec, shortcut)


def test_a_rank_flip_on_a_hand_made_trace_is_found_at_the_cpu_speed_computed_by_hand():
    """gpu_only runs 4 experts per layer on the GPU: 4 g. Fiddler (overlapped) runs 2 hits on
    the GPU and the 2 misses on the CPU: max(2 g, 2 c / s) at s x the CPU throughput. The
    non-expert time is the same for both, so fiddler wins once 2 c / s < 4 g: s* = c / (2 g)."""
    hw = flip_hardware()
    cost = CostModel(G, hw)
    g, c = cost.gpu_expert_time(N), cost.cpu_expert_time(N)
    by_hand = c / (2 * g)
    assert by_hand == pytest.approx(2.0) and c <= cost.copy_time(1) + g  # fiddler's rule keeps misses on the CPU
    trace, calibration = hand_made_traces()
    replayers = {"gpu_only": job("gpu_only", {}, hw, trace, calibration),
                 "fiddler": job("fiddler", {"overlap": True}, hw, trace, calibration)}
    roles = Roles(references=(), baselines=("gpu_only",))
    cell = analyse_cell("hand", replayers, {}, scale_grid(0.25, 4, 9), roles, ["cpu_tflops"], tolerance=0.001)
    result = cell.constants[0]
    assert roles.winner(cell.base) == "gpu_only"
    assert by_hand <= result.winner_up.factor <= by_hand * 1.001
    assert roles.winner(result.winner_up.speeds) == "fiddler"
    assert result.winner_down.factor is None
    # the margin (fiddler over gpu_only) moves by 10% where the non-expert time and 2 c / s add up to 1/1.1 of 1x's
    ne = cost.non_expert_time(16, 64)
    layers = G.n_moe_layers
    s_margin = 2 * layers * c / ((ne + 2 * layers * c) / 1.1 - ne)
    assert s_margin <= result.margin_up.factor <= s_margin * 1.001


# ---- re-charges equal replays -----------------------------------------------------------------

VARIANTS = {"gpu_only": ("gpu_only", {}), "mixtral_offload": ("mixtral_offload", {}), "fiddler": ("fiddler", {}),
            "tide": ("tide", {}), "tide-sequential": ("tide", {"overlap": False}), "tide-3": ("tide", {"tau": "3"})}


PLANNED = ("fiddler", "tide", "tide-sequential")  # their decision keys change over the profiles below


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_recharges_give_the_bits_of_full_replays(variant):
    mini = LLaDA2Config.published("llada2_mini")
    trace = synthetic_trace(mini, steps=24, tokens=24, block=8, seed=4)
    name, options = VARIANTS[variant]
    hw = HardwareConfig()
    shortcut = JobReplayer(JobSpec(system_config(name, options), mini, 64, "per_layer", hw, trace, trace, 8, 64))
    full = JobReplayer(JobSpec(system_config(name, options), mini, 64, "per_layer", hw, trace, trace, 8, 64), False)
    profiles = [hw, scaled(hw, "cpu_tflops", 3.0), scaled(hw, "pcie_gbps", 0.3), scaled(hw, "gpu_hbm_gbps", 2.0),
                scaled(hw, "cpu_tflops", 3.0), scaled(hw, "cpu_tflops", 0.05), scaled(hw, "pcie_gbps", 30.0),
                scaled(hw, "pcie_gbps", 0.01)]
    assert [shortcut.modeled_seconds(p) for p in profiles] == [full.modeled_seconds(p) for p in profiles]
    assert full.recharges == 0 and shortcut.recharges >= 1  # the shortcut was taken at least once
    if variant in PLANNED:  # a new decision key was planned without the ledger and charged by the re-charge
        assert shortcut.planned >= 1


# ---- the command on a small sweep -------------------------------------------------------------

def small_sweep(root: Path, cache: Path, uri: str = "sqlite:///unused.db", extra: tuple[str, ...] = ()) -> Path:
    """A hand-built replay sweep of the tiny model: three systems x two budgets."""
    sweep = root / "sweep"
    systems = [["system=gpu_only"], ["system=fiddler"], ["system=tide", "system.tau=2"]]
    for i, (budget, system) in enumerate((b, s) for b in (8, 24) for s in systems):
        overrides = ["model=tiny", "decode.gen_length=12", "decode.block_length=8", "decode.steps=8",
                     "limit_prompts=2", "source=trace", "budget=custom", f"budget.experts_per_layer={budget}",
                     f"cache_dir={cache}", "tracking.enabled=false", f"tracking.uri={uri}", *system, *extra]
        job_dir = sweep / str(i)
        (job_dir / ".hydra").mkdir(parents=True)
        (job_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        run_job(compose_checked(overrides), job_dir)
    return sweep


def without_times(text: str) -> str:
    """The table without what differs between two runs of it: the seconds and the command."""
    text = re.sub(r"re-charges, [0-9.]+ s\.", "re-charges, _ s.", text)
    return re.sub(r"Command: `[^`]*`", "Command: _", text)


def test_the_command_writes_the_table_csv_and_a_tornado_per_cell(proxy_cache, tiny_dir, tmp_path, capsys):
    """...the same files to the byte whether its two cells run in this process or in two workers."""
    sweep = small_sweep(tmp_path, proxy_cache)
    out, serial = tmp_path / "out", tmp_path / "serial"
    args = [f"sweep={sweep}", "scales=0.5,2,3", "constants=cpu_tflops,pcie_gbps", "tracking=false",
            "references=gpu_only"]
    assert sensitivity_main([*args, f"out={out}", "jobs=2"]) == 0
    assert sensitivity_main([*args, f"out={serial}", "jobs=1"]) == 0
    assert (out / "sensitivity.csv").read_bytes() == (serial / "sensitivity.csv").read_bytes()
    assert without_times((out / "sensitivity.md").read_text()) == without_times((serial / "sensitivity.md").read_text())
    # a worker's one-line error is the command's: a job whose trace is gone
    result = json.loads((sweep / "4" / "result.json").read_text())
    result["trace"] = str(tmp_path / "gone.npz")
    (sweep / "4" / "result.json").write_text(json.dumps(result))
    with pytest.raises(HarnessError, match=r"its trace .*gone\.npz is gone; run the sweep again"):
        sensitivity_main([*args, f"out={tmp_path / 'failed'}", "jobs=2"])
    text = (out / "sensitivity.md").read_text()
    assert "## Headline" in text and "CPU throughput (`cpu_tflops`)" in text and "| estimate |" in text
    rows = list(csv.DictReader((out / "sensitivity.csv").open()))
    cells = {r["cell"] for r in rows}
    assert len(cells) == 2 and len(list(out.glob("tornado_*.png"))) == 2
    # every system at every factor of every constant, ranked
    assert {(r["constant"], r["factor"]) for r in rows} == {(c, f) for c in ("cpu_tflops", "pcie_gbps")
                                                            for f in ("0.5", "1", "2")}
    at_one = [r for r in rows if r["factor"] == "1" and r["constant"] == "cpu_tflops"]
    assert len(at_one) == 6 and {r["rank"] for r in at_one} == {"1", "2", "3"}
    assert "Warning" not in text  # the 1x replays equal the sweep's recorded figures
    for row in at_one:
        assert math.isfinite(float(row["tokens_per_s"]))


def test_jobs_served_in_lock_step_batches_are_re_charged_batched(proxy_cache, tiny_dir, tmp_path):
    """A sweep served two requests a batch: its 1x re-charges are the recorded figures (the
    analysis batches the trace as the job's replay did, not the unbatched trace)."""
    sweep = small_sweep(tmp_path, proxy_cache, extra=("workload.batch=2",))
    out = tmp_path / "out"
    assert sensitivity_main([f"sweep={sweep}", "scales=0.5,2,3", "constants=pcie_gbps", "tracking=false",
                             "references=gpu_only", f"out={out}", "jobs=1"]) == 0
    text = (out / "sensitivity.md").read_text()
    assert "## Headline" in text and "Warning" not in text  # base_mismatches: every 1x replay equals its job's


def test_the_command_logs_under_the_sweeps_parent_run(proxy_cache, tiny_dir, tmp_path):
    from harness.tracking.mlflow_store import open_store
    from harness.tracking.settings import TrackingConfig
    from harness.tracking.sweep_run import start_parent_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = small_sweep(tmp_path, proxy_cache, uri)
    parent = start_parent_run(TrackingConfig(uri=uri), sweep, {"tiny"}, ["system=gpu_only,fiddler,tide"])
    assert sensitivity_main([f"sweep={sweep}", "scales=0.5,2,3", "constants=pcie_gbps", "references=gpu_only"]) == 0
    client = open_store(uri)
    run = client.get_run(parent)
    assert run.data.tags["harness.sensitivity"] == "sensitivity/sensitivity.md"
    assert any(k.startswith("sensitivity.") and k.endswith(".margin") for k in run.data.metrics)
    logged = {a.path for a in client.list_artifacts(parent, "sensitivity")}
    assert {"sensitivity/sensitivity.md", "sensitivity/sensitivity.csv"} <= logged
    assert sum(p.startswith("sensitivity/tornado_") for p in logged) == 2


def test_the_command_refuses_bad_arguments_in_one_line(tmp_path):
    with pytest.raises(HarnessError, match="needs sweep="):
        sensitivity_main([])
    with pytest.raises(HarnessError, match="unknown argument"):
        sensitivity_main([f"sweep={tmp_path}", "colour=red"])
    with pytest.raises(HarnessError, match="no finished job"):
        sensitivity_main([f"sweep={tmp_path}", "tracking=false"])
    with pytest.raises(HarnessError, match="jobs='two' must be a whole number"):
        sensitivity_main([f"sweep={tmp_path}", "jobs=two"])
    with pytest.raises(HarnessError, match="tracking='no' must be true or false"):
        sensitivity_main([f"sweep={tmp_path}", "tracking=no"])


def test_the_tornado_label_names_the_contenders_measured_not_the_winner():
    from harness.sensitivity.output import margin_label

    # fiddler (a baseline) is the 1x winner; the margin is still tide's side over the baselines
    speeds = {"gpu_only": 9.0, "fiddler": 5.0, "mixtral_offload": 2.0, "tide": 4.0, "tide_sequential": 3.0}
    label = margin_label(speeds, Roles())
    assert label == ("margin: best of tide, tide_sequential over best of fiddler, mixtral_offload\n"
                     "(tokens/s ratio, modeled)")
    assert Roles().winner(speeds) == "fiddler"
