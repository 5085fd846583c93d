"""The training corpus: the Python standard library sources of the running interpreter.

Every machine that runs the harness has them, so a trained proxy needs no download. The
files are found through `sysconfig`, taken in a fixed order (sorted by a hash of their
relative path, which spreads the modules evenly when a byte cap cuts the list), and every
file that contains a workload or calibration prompt is left out, so the prompts the
harness decodes are never training data. The digest covers the file names and bytes.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

from harness.common.errors import HarnessError

CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"
# test suites, IDLE and vendored packages are not the library; installed packages are not stdlib
SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}


@dataclass(frozen=True)
class Corpus:
    root: str
    files: tuple[str, ...]  # relative to root, in corpus order
    texts: tuple[str, ...]
    digest: str
    held_out: tuple[str, ...]  # files left out because they contain a workload prompt

    @property
    def n_bytes(self) -> int:
        return sum(len(t.encode()) for t in self.texts)

    def manifest(self) -> dict:
        return {"root": self.root, "files": list(self.files), "digest": self.digest,
                "bytes": self.n_bytes, "held_out": list(self.held_out)}


def stdlib_root() -> Path:
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise HarnessError(f"the interpreter's standard library {root} is missing; the trained proxy "
                           "learns from it (use model.weights=random)")
    return root


def stdlib_sources(root: Path) -> list[str]:
    """Relative paths of the library's .py files, in a fixed, module-spreading order. The
    skipped directories are pruned from the walk, not filtered after it: site-packages sits
    inside the stdlib directory, and walking it costs about a second per process."""
    rel: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_PARTS]
        base = Path(folder).relative_to(root)
        rel.extend(str(base / f) for f in files if f.endswith(".py"))
    return sorted(rel, key=lambda r: hashlib.sha256(r.encode()).hexdigest())


def protected_prompts(conf_dir: Path = CONF_DIR) -> list[str]:
    """Every prompt listed in the built-in workloads and calibration sets."""
    prompts: list[str] = []
    for group in ("workload", "calibration"):
        for path in sorted((conf_dir / group).glob("*.yaml")):
            node = OmegaConf.load(path)
            prompts.extend(str(p) for p in node.get("prompts", None) or [])
    return prompts


def holds_prompt(text: str, prompts: list[str]) -> bool:
    lowered = text.lower()
    return any(p.lower() in lowered for p in prompts if p.strip())


def build_corpus(root: Path, max_bytes: int, prompts: list[str]) -> Corpus:
    """Whole files in corpus order until `max_bytes` (0: all), leaving out prompt holders."""
    digest = hashlib.sha256()
    files, texts, held_out, size = [], [], [], 0
    for rel in stdlib_sources(root):
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if holds_prompt(text, prompts):
            held_out.append(rel)
            continue
        files.append(rel)
        texts.append(text)
        digest.update(rel.encode() + b"\0" + text.encode() + b"\0")
        size += len(text.encode())
        if max_bytes and size >= max_bytes:
            break
    if not files:
        raise HarnessError(f"no Python sources under {root}; the trained proxy needs the standard library")
    return Corpus(str(root), tuple(files), tuple(texts), digest.hexdigest()[:16], tuple(held_out))


@lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int) -> Corpus:
    """The corpus of this interpreter (cached per process: reading it takes a moment)."""
    return build_corpus(stdlib_root(), max_bytes, protected_prompts())
