"""The proxy tokenizer read without transformers gives transformers' ids and text."""

from __future__ import annotations

import json
import random

from transformers import AutoTokenizer

from harness.decode.workload import encode_prompt
from harness.model.checkpoint import load_tokenizer
from harness.model.tokenizer import ProxyTokenizer, proxy_tokenizer


def test_the_light_tokenizer_matches_transformers_on_the_proxy(tiny_dir):
    light = load_tokenizer(tiny_dir)
    assert isinstance(light, ProxyTokenizer)
    full = AutoTokenizer.from_pretrained(str(tiny_dir), trust_remote_code=False)
    texts = ["def f(x):\n    return x + 1\n", "Write a function that sorts a list.", "", "  spaces\tand\ttabs ",
             "unicode: é ü 漢字 🙂", "<|endoftext|> inside text <|mask|>"]
    for text in texts:
        assert encode_prompt(light, text) == encode_prompt(full, text), text
    rng = random.Random(0)
    for _ in range(50):  # any ids, special tokens among them, decode to the same text
        ids = [rng.randrange(len(light)) for _ in range(rng.randrange(1, 40))]
        assert light.decode(ids) == full.decode(ids)
    for attr in ("eos_token_id", "mask_token_id", "pad_token_id"):
        assert getattr(light, attr) == getattr(full, attr) is not None, attr


def test_a_checkpoint_that_is_not_a_plain_proxy_keeps_autotokenizer(tiny_dir, tmp_path):
    # no proxy marker (a real checkpoint's directory), or a chat template: not the light tokenizer
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    assert proxy_tokenizer(tmp_path) is None
    (tmp_path / "PROXY_COMPLETE").write_text("3")
    assert isinstance(proxy_tokenizer(tmp_path), ProxyTokenizer)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    assert proxy_tokenizer(tmp_path) is None
