"""One run: load the model, decode the workload under a system, write result.json.

Data flow (DESIGN section 3): config -> model (real or proxy) -> decode every prompt with
the common loop -> summary -> result.json in the run directory (atomically).
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import harness
from harness.config import validate
from harness.decoding import DecodeOutput, DecodeSettings, OnForward, StepInfo, decode
from harness.model import KVCache, LoadedModel, load_model
from harness.results import write_json_atomic
from harness.workload import encode_prompt, load_prompts


@dataclass
class DecodeBatch:
    outputs: list[DecodeOutput]
    wall_s: float

    @property
    def generated_tokens(self) -> int:
        return sum(o.n_generated for o in self.outputs)

    @property
    def denoise_steps(self) -> int:
        return sum(1 for o in self.outputs for r in o.records if r.kind == "denoise")

    @property
    def forwards(self) -> int:
        return sum(len(o.records) for o in self.outputs)

    @property
    def routed_tokens(self) -> int:
        return sum(r.tokens_routed for o in self.outputs for r in o.records)


def decode_settings(cfg: DictConfig) -> DecodeSettings:
    return DecodeSettings(**OmegaConf.to_container(cfg.decode, resolve=True))


def decode_prompts(
    loaded: LoadedModel,
    prompts: list[str],
    settings: DecodeSettings,
    on_forward: OnForward | None = None,
    desc: str = "decode",
) -> DecodeBatch:
    """Decode prompts one at a time (batch 1, as in the offloading papers)."""
    cfg = loaded.model.config
    outputs: list[DecodeOutput] = []
    global_step = 0
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", mininterval=0.5, leave=False, dynamic_ncols=True)

    def hook(step: StepInfo, n_tokens: int, n_context: int) -> None:
        if step.kind == "denoise" and step.step == 0:
            bar.set_postfix_str(f"block {step.block}", refresh=False)
        if on_forward is not None:
            on_forward(step, n_tokens, n_context)

    start = time.perf_counter()
    for i, text in enumerate(prompts):
        ids = encode_prompt(loaded.tokenizer, text)
        out = decode(
            loaded.model, ids, settings, cfg.mask_token_id, cfg.eos_token_id,
            new_cache=KVCache, on_forward=hook, prompt_index=i, first_global_step=global_step,
        )
        global_step += len(out.records)
        outputs.append(out)
        bar.update(1)
    bar.close()
    return DecodeBatch(outputs, time.perf_counter() - start)


def versions() -> dict[str, str]:
    import hydra
    import transformers

    return {
        "harness": harness.__version__, "python": platform.python_version(), "torch": torch.__version__,
        "hydra": hydra.__version__, "transformers": transformers.__version__, "machine": platform.node(),
    }


def run_job(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Run one configuration end to end and write `result.json` into `run_dir`."""
    validate(cfg)
    prompts = load_prompts(cfg.workload, cfg.limit_prompts)
    settings = decode_settings(cfg)
    t0 = time.perf_counter()
    loaded = load_model(cfg.model, cfg.cache_dir)
    load_s = time.perf_counter() - t0

    batch = decode_prompts(loaded, prompts, settings, desc=f"{cfg.system.name}")
    tok = loaded.tokenizer
    first_text = tok.decode([t for t in batch.outputs[0].generated[: batch.outputs[0].n_generated]])
    metrics = {
        "prompts": len(prompts),
        "generated_tokens": batch.generated_tokens,
        "denoise_steps": batch.denoise_steps,
        "forwards": batch.forwards,
        "routed_tokens": batch.routed_tokens,
        "wall_s": batch.wall_s,
        "wall_tokens_per_s": batch.generated_tokens / batch.wall_s if batch.wall_s > 0 else 0.0,
        "load_s": load_s,
    }
    result = {
        "schema": 1,
        "system": cfg.system.name,
        "model": cfg.model.name,
        "weights": loaded.weights,
        "checkpoint": str(loaded.path),
        "timing": "wall",
        "decode_cache": settings.cache,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "metrics": metrics,
        "outputs": [{"prompt_tokens": len(o.prompt_ids), "tokens": o.generated, "n_generated": o.n_generated,
                     "stopped_at_eos": o.stopped_at_eos} for o in batch.outputs],
        "steps": [asdict(r) for o in batch.outputs for r in o.records],
        "first_text": first_text,
        "versions": versions(),
    }
    write_json_atomic(Path(run_dir) / "result.json", result)
    return result


def summary_lines(result: dict[str, Any], show_text: bool = True) -> list[str]:
    m = result["metrics"]
    lines = [
        f"[{result['system']}] model={result['model']} ({result['weights']} weights) cache={result['decode_cache']}: "
        f"{m['prompts']} prompts, {m['generated_tokens']} tokens generated, {m['denoise_steps']} denoising steps, "
        f"wall {m['wall_tokens_per_s']:.1f} tokens/s"
    ]
    if show_text:
        lines.append(f"first prompt's output: {result['first_text'][:300]!r}")
    return lines
