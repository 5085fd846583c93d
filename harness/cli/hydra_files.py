"""Hydra's own files (`.hydra/config.yaml`, `hydra.yaml`, `overrides.yaml`) written the way
the harness writes its files: atomically (a temporary sibling, fsync, rename), and a write
that fails for lack of space or permission is one line and exit code 2 (docs/bad-input.md).

Hydra writes them inside its `run_job`, under its own handler, which prints a traceback and
exits 1 for any exception. So the failure is carried past it as `HydraFileFailed`, a
BaseException that Hydra's `except Exception` lets through, to the entry point's one line.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core import utils as hydra_utils
from omegaconf import DictConfig, OmegaConf

from harness.common.errors import OutputError
from harness.common.files import write_atomic


class HydraFileFailed(BaseException):  # a BaseException: carried past Hydra's `except Exception`
    """A file of Hydra's could not be written (a full disk, a read-only file system)."""


def save_config(cfg: DictConfig, filename: str, output_dir: Path) -> None:
    """`hydra.core.utils._save_config`, atomic and with one-line failures."""
    text = OmegaConf.to_yaml(cfg).encode()
    try:
        write_atomic(Path(output_dir) / filename, lambda f: f.write(text))
    except OutputError as exc:
        raise HydraFileFailed(str(exc)) from None


def install() -> None:
    """Route Hydra's config files through `save_config` (run_job looks the name up in its module)."""
    hydra_utils._save_config = save_config
