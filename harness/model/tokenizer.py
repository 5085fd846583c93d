"""The tokenizer of a proxy checkpoint, read with the `tokenizers` library alone.

A proxy's tokenizer is a byte-level BPE with no chat template, written by the harness
(harness/model/proxy.py `build_tokenizer`); transformers' AutoTokenizer reads it too, but
importing transformers costs about a second per process, which every run and every test
subprocess on a proxy paid for nothing. `ProxyTokenizer` answers what the harness asks of
a tokenizer (encode, decode, the end-of-text and mask ids) with the same ids and text as
transformers' fast tokenizer over the same file (tests/unit/test_proxy_tokenizer.py holds
them together). Real checkpoints keep AutoTokenizer (chat templates, their own classes).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

PROXY_MARKER = "PROXY_COMPLETE"  # written last by every proxy the harness builds
CONFIG = "tokenizer_config.json"
FAST_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")  # a plain tokenizer.json, nothing else


class ProxyTokenizer:
    """encode/decode over a proxy's tokenizer.json, as transformers' fast tokenizer does."""

    chat_template = None

    def __init__(self, directory: Path, config: dict) -> None:
        self.backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.eos_token = config.get("eos_token")
        self.mask_token = config.get("mask_token")
        self.pad_token = config.get("pad_token")
        self.eos_token_id = self._id(self.eos_token)
        self.mask_token_id = self._id(self.mask_token)
        self.pad_token_id = self._id(self.pad_token)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def __len__(self) -> int:
        return self.backend.get_vocab_size()


def proxy_tokenizer(directory: Path) -> ProxyTokenizer | None:
    """The light tokenizer of a harness-built proxy directory; None for anything else (a real
    checkpoint, a tokenizer with a chat template or another class), which AutoTokenizer reads."""
    config_path = directory / CONFIG
    if not ((directory / PROXY_MARKER).is_file() and (directory / "tokenizer.json").is_file()
            and config_path.is_file()):
        return None
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict) or config.get("chat_template") or config.get("tokenizer_class") not in FAST_CLASSES:
        return None
    if any(not isinstance(config.get(k), str | None) for k in ("eos_token", "mask_token", "pad_token")):
        return None
    return ProxyTokenizer(directory, config)
