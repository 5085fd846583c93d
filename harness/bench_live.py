"""Benchmark: the live path's cost against floors measured in the same run.

    python -m harness.bench_live [models=tiny,mini,...] [system=tide] [gen_length=32] [threads=1]
                                 [build=true] [main=true] [format=table|json] [out=<file.json>]

Per model, CPU and wall seconds of:
- build: the proxy checkpoint written from nothing (in a fresh temporary cache);
- load: the checkpoint loaded as a run loads it (headers checked, NaN scan, model built),
  against reading its weight files' bytes (`load_vs_read`) and against safetensors' own
  loader making the same tensors (`load_vs_safetensors`); a proxy holds ~15k tensors in the
  published layout, so per-tensor work, not bytes, is its floor;
- one forward by phase, the mean over the forwards of one prompt's decode under `system`:
  attention, router, engine (the system's plan, the plan checks, residency and the ledger),
  experts (the routed experts' arithmetic), combine (the fixed-order sum that keeps every
  placement's output bit-identical: the lossless bookkeeping), other (norms, embeddings,
  the shared expert, the head, the decode loop);
- the whole decode under the engine, against the same decode with the model's own plain
  forward and no engine (`engine_vs_plain`: the target is 3x), and the routed experts
  against the same rows computed as one dense matmul chain (`experts_vs_matmul`).
And once, in fresh processes: the imports of a run against `import torch`, and
`python -m harness` (the README's main job) cold (empty cache) and warm.

Phases are timed by wrapping the functions that do them, in this process only, with the
thread's CPU clock and the wall clock; torch runs on `threads` threads (1: the CPU clock of
the calling thread is the whole cost). Compare ratios, not absolute times: on a shared
machine both swing with load, the ratios much less.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import harness.engine.engine as engine_module
import harness.families.bridge as bridge_module
import harness.model.experts as experts_module
from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError, exit_with
from harness.common.files import write_json_atomic
from harness.common.keyvalue import KeyValueCommand, Option, program_name
from harness.decode.decode_batch import DecodeBatch, decode_prompts, decode_with_engine
from harness.decode.decoding import DecodeSettings, steps_per_block
from harness.decode.loading import LoadedModel
from harness.decode.workload import load_prompts
from harness.engine.engine import OffloadEngine
from harness.job.artifacts import calibration_trace
from harness.job.config import register_configs
from harness.job.setup import setup_run
from harness.model.experts import RoutedExperts
from harness.zoo.entry import load_model, nominal_geometry

REPO = Path(__file__).resolve().parent.parent
MODELS = ("tiny", "mini", "flash", "qwen3_moe", "mixtral", "olmoe", "diffusiongemma")
ARGS = {"models": "tiny,mini", "system": "tide", "gen_length": "32", "threads": "1", "build": "true",
        "main": "true", "format": "table", "out": None}
COMMAND = KeyValueCommand("python -m harness.bench_live", "the live path's cost against floors measured in one run", [
    Option("models", f"comma-separated models ({', '.join(MODELS)})", ARGS["models"]),
    Option("system", "the system whose engine decodes", ARGS["system"]),
    Option("gen_length", "tokens generated for the one prompt decoded", ARGS["gen_length"]),
    Option("threads", "torch threads", ARGS["threads"]),
    Option("build", "also build each proxy from nothing in a temporary cache: true | false", ARGS["build"]),
    Option("main", "also time python -m harness cold and warm, and the imports: true | false", ARGS["main"]),
    Option("format", "table | json", ARGS["format"]),
    Option("out", "also write the figures to this JSON file"),
], example="python -m harness.bench_live models=mini build=false main=false")


@dataclass
class Clock:
    """CPU (this thread) and wall seconds of a piece of work."""

    cpu: float = 0.0
    wall: float = 0.0
    calls: int = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            self.cpu += time.thread_time() - cpu
            self.wall += time.perf_counter() - wall


def timed(work: Callable[[], object]) -> tuple[object, Clock]:
    clock = Clock()
    with clock.running():
        out = work()
    return out, clock


@dataclass
class Phases:
    """Exclusive time per phase: a phase inside another is taken out of the outer one."""

    clocks: dict[str, Clock] = field(default_factory=dict)
    stack: list[tuple[str, float, float]] = field(default_factory=list)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed_call(*args, **kwargs):
            self.stack.append((name, time.thread_time(), time.perf_counter()))
            try:
                return fn(*args, **kwargs)
            finally:
                _, cpu0, wall0 = self.stack.pop()
                cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
                clock = self.clocks.setdefault(name, Clock())
                clock.cpu += cpu
                clock.wall += wall
                clock.calls += 1
                if self.stack:  # the outer phase did not spend this time itself
                    outer = self.clocks.setdefault(self.stack[-1][0], Clock())
                    outer.cpu -= cpu
                    outer.wall -= wall
        return timed_call


Target = tuple[object, str, Callable[[Callable], Callable]]  # (owner, attribute, original -> replacement)


@contextlib.contextmanager
def patched(targets: list[Target]) -> Iterator[None]:
    """Replace each `owner.attribute` by its wrapper for the duration; restored on exit."""
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in targets]
    for owner, attr, wrapper in targets:
        setattr(owner, attr, wrapper(getattr(owner, attr)))
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def child_run(argv: list[str], env: dict[str, str] | None = None) -> Clock:
    """CPU (user + sys of the child) and wall seconds of a fresh process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise HarnessError(f"benchmark step {' '.join(argv[1:4])} failed (exit {proc.returncode}): {tail[0]}")
    return Clock(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall)


def startup_figures(threads: int) -> dict[str, float]:
    """Imports of a run and the README's main job, each in fresh processes."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    py = sys.executable
    torch_only = child_run([py, "-c", "import torch"], env)
    imports = child_run([py, "-c", "import harness.__main__"], env)
    out: dict[str, float] = {"import_torch_cpu_s": torch_only.cpu, "import_torch_wall_s": torch_only.wall,
                             "import_run_cpu_s": imports.cpu, "import_run_wall_s": imports.wall,
                             "import_vs_torch": imports.cpu / torch_only.cpu}
    with tempfile.TemporaryDirectory(prefix="bench-main-") as tmp:
        env.update(HARNESS_CACHE=str(Path(tmp) / "cache"))
        main = [py, "-m", "harness", "tracking.enabled=false", "show_text=false"]
        for label in ("cold", "warm"):
            clock = child_run([*main, f"hydra.run.dir={Path(tmp) / label}"], env)
            out[f"main_{label}_cpu_s"], out[f"main_{label}_wall_s"] = clock.cpu, clock.wall
    return out


def checkpoint_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.suffix == ".safetensors")


def safetensors_floor(path: Path) -> Clock:
    """safetensors' own loader over the same files: every tensor made, nothing checked or built."""
    files = sorted(f for f in path.iterdir() if f.suffix == ".safetensors")
    return timed(lambda: [load_file(str(f)) for f in files])[1]


def read_floor(path: Path) -> Clock:
    """Reading every weight file's bytes (the load's floor)."""
    def read() -> int:
        return sum(len(f.read_bytes()) for f in sorted(path.iterdir()) if f.suffix == ".safetensors")
    read()  # the same page-cache state the load then finds
    return timed(read)[1]


def batched_floor(n_experts: int, hidden: int, intermediate: int, rows: int, calls: int) -> Clock:
    """The routed experts' arithmetic alone: `rows` token-expert rows, each with its own
    expert's weights already gathered, as one batched matmul per projection, `calls` times
    (what a forward's layers compute, without finding, gathering or summing anything)."""
    g = torch.Generator().manual_seed(0)
    experts = torch.randint(0, n_experts, (rows,), generator=g)
    gate_up = torch.randn(n_experts, hidden, 2 * intermediate, generator=g)[experts]  # [R, H, 2I]
    down = torch.randn(n_experts, intermediate, hidden, generator=g)[experts]  # [R, I, H]
    x = torch.randn(rows, 1, hidden, generator=g)

    def arithmetic() -> None:
        for _ in range(calls):
            gate, up = torch.bmm(x, gate_up).chunk(2, dim=-1)
            torch.bmm(F.silu(gate) * up, down)
    arithmetic()
    return timed(arithmetic)[1]


def expert_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(experts per layer, hidden size, expert width) of a loaded model's routed experts."""
    for module in model.modules():
        if isinstance(module, RoutedExperts):
            return len(module), module[0].gate.shape[1], module[0].gate.shape[0]
        if hasattr(module, "gate_up_proj") and hasattr(module, "hidden_dim"):  # transformers' experts interface
            n, hidden = module.gate_up_proj.shape[0], module.hidden_dim
            return n, hidden, module.down_proj.numel() // (n * hidden)
    raise HarnessError(f"{type(model).__name__} has no routed experts the benchmark knows")


def phase_targets(model: torch.nn.Module, phases: Phases) -> list[Target]:
    """The functions that do each phase of a forward, wrapped to time it. Both ways experts are
    computed are wrapped (the project's own models call `compute_routed_experts`; a transformers
    family's bridge `compute_experts`, harness/families/bridge.py); a model uses one of them.
    Attention and router modules are found by their class names (LLaDA2's `Attention` and
    `Router`, a family's `*Attention` and `*Router`)."""
    def timing(name: str) -> Callable[[Callable], Callable]:
        return lambda fn: phases.wrap(name, fn)

    classes = {type(m) for m in model.modules()}
    return [(OffloadEngine, "decide", timing("engine")), (OffloadEngine, "account", timing("engine")),
            (engine_module, "compute_routed_experts", timing("experts")),
            (experts_module, "combine", timing("combine")),
            (bridge_module, "compute_experts", timing("experts")),
            *((c, "forward", timing("attention")) for c in classes if c.__name__.endswith("Attention")),
            *((c, "forward", timing("router")) for c in classes if c.__name__.endswith("Router"))]


def decode_clock(loaded: LoadedModel, prompts: list[str], settings: DecodeSettings,
                 engine: OffloadEngine | None) -> tuple[DecodeBatch, Clock]:
    """One decode under `engine`, or (None) with the model's own forward and no engine."""
    if engine is not None:
        return timed(lambda: decode_with_engine(loaded, engine, prompts, settings, desc="bench"))
    return timed(lambda: decode_prompts(loaded, prompts, settings, desc="plain"))


def measure_model(name: str, system: str, gen_length: int, build: bool) -> dict[str, float | str]:
    """One model's figures (module docstring)."""
    overrides = [f"model={name}", f"system={system}", "limit_prompts=1", f"decode.gen_length={gen_length}",
                 "tracking.enabled=false"]
    cfg = compose_checked(overrides)
    row: dict[str, float | str] = {}
    if build:
        with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
            _, clock = timed(lambda: load_model(cfg.model, tmp))
            row["build_cpu_s"], row["build_wall_s"] = clock.cpu, clock.wall
    load_model(cfg.model, cfg.cache_dir)  # built if missing; then loaded warm
    loaded, load = timed(lambda: load_model(cfg.model, cfg.cache_dir))
    read, library = read_floor(loaded.path), safetensors_floor(loaded.path)
    row.update(weights_mb=checkpoint_bytes(loaded.path) / 1e6, load_cpu_s=load.cpu, load_wall_s=load.wall,
               read_cpu_s=read.cpu, read_wall_s=read.wall, load_vs_read=load.wall / max(read.wall, 1e-9),
               safetensors_cpu_s=library.cpu, load_vs_safetensors=load.cpu / max(library.cpu, 1e-9))
    prompts = load_prompts(cfg.workload, 1)
    settings = cfg.decode
    setup = setup_run(cfg, nominal_geometry(cfg.model))
    calibration = calibration_trace(cfg, settings, lambda: loaded) if setup.needs_calibration else None

    def engine() -> OffloadEngine:
        e = setup.engine()
        e.prepare(calibration, steps_per_block(settings))
        return e

    decode_clock(loaded, prompts, settings, engine())  # warm-up: first-call costs (kernels, caches)
    plain_batch, plain = decode_clock(loaded, prompts, settings, None)
    phases = Phases()
    with patched(phase_targets(loaded.model, phases)):
        batch, whole = decode_clock(loaded, prompts, settings, engine())
    forwards = max(1, batch.forwards)
    row.update(forwards=batch.forwards, decode_cpu_s=whole.cpu, decode_wall_s=whole.wall,
               plain_cpu_s=plain.cpu, plain_wall_s=plain.wall,
               engine_vs_plain=whole.cpu / max(plain.cpu, 1e-9),
               same_tokens=str([o.generated for o in plain_batch.outputs] == [o.generated for o in batch.outputs]))
    measured = sum(c.cpu for c in phases.clocks.values())
    for phase, clock in sorted(phases.clocks.items()):
        row[f"{phase}_ms_per_forward"] = 1e3 * clock.cpu / forwards
    row["other_ms_per_forward"] = 1e3 * max(0.0, whole.cpu - measured) / forwards
    n_experts, hidden, width = expert_shape(loaded.model)
    top_k = loaded.nominal.num_experts_per_tok
    experts = phases.clocks.get("experts")
    if experts is not None and experts.calls:  # one call per MoE layer per forward
        rows_per_call = batch.routed_tokens * top_k / forwards
        floor = batched_floor(n_experts, hidden, width, max(1, round(rows_per_call)), experts.calls)
        row["experts_floor_ms_per_forward"] = 1e3 * floor.cpu / forwards
        row["experts_vs_batched"] = experts.cpu / max(floor.cpu, 1e-9)
    return row


def format_report(report: dict) -> str:
    """The figures as one table per kind of figure, models as columns."""
    frame = pd.DataFrame(report["models"])
    lines = [f"live-path benchmark: system={report['system']} gen_length={report['gen_length']} "
             f"threads={report['threads']} torch={report['torch']} ({report['cpu_kernels']}); CPU seconds are the "
             "thread's (the child's for fresh processes); ratios are measured in this run",
             frame.to_string(float_format=lambda v: f"{v:.3g}")]
    if "startup" in report:
        lines += ["", "fresh processes:", pd.Series(report["startup"]).to_string(float_format=lambda v: f"{v:.3g}")]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    COMMAND.prog = program_name(COMMAND.prog)
    args = dict(ARGS)
    args.update(COMMAND.parse(argv))
    models = [m for m in str(args["models"]).split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        raise HarnessError(f"models={args['models']!r}: choose from {', '.join(MODELS)}")
    for key in ("build", "main"):
        if args[key] not in ("true", "false"):
            raise HarnessError(f"{key}={args[key]!r} must be true or false")
    if args["format"] not in ("table", "json"):
        raise HarnessError(f"format={args['format']!r} must be table or json")
    threads, gen_length = (str(args[k]) for k in ("threads", "gen_length"))
    if not (threads.isdigit() and 1 <= int(threads) <= 64 and gen_length.isdigit() and 1 <= int(gen_length) <= 4096):
        raise HarnessError("threads must be 1..64 and gen_length 1..4096")
    if args["out"]:
        write_json_atomic(Path(str(args["out"])), {})  # an unwritable out= fails before minutes of work
    torch.set_num_threads(int(threads))
    report: dict = {"threads": int(threads), "system": args["system"], "gen_length": int(gen_length),
                    "torch": torch.__version__, "cpu_kernels": torch.backends.cpu.get_cpu_capability()}
    register_configs()
    report["models"] = {m: measure_model(m, str(args["system"]), int(gen_length), args["build"] == "true")
                        for m in models}
    if args["main"] == "true":
        report["startup"] = startup_figures(int(threads))
    if args["out"]:
        write_json_atomic(Path(str(args["out"])), report)
    if args["format"] == "json":
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report))
    return 0


def cli() -> None:
    exit_with(main, sys.argv[1:])


if __name__ == "__main__":
    cli()
