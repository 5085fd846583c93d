"""Reading the grouped-GEMM tile off a timing series (harness/accounting/gemm_tile.py) on
hand-made staircases: steps at multiples of 64 give 64, of 32 give 32, with noise too; a
smooth or linear curve, a flat one and too short a sweep give none."""

from __future__ import annotations

import numpy as np
import pytest

from harness.accounting.gemm_tile import detect_tile

TOKENS = list(range(256, 769))  # the profiler's sweep


def staircase(tile: int, tokens: list[int] = TOKENS, base: float = 40e-6, step: float = 5e-6) -> list[float]:
    """A padded GEMM: time grows by `step` per started tile of rows."""
    return [base + step * -(-n // tile) for n in tokens]


@pytest.mark.parametrize("tile", [8, 16, 32, 64, 128])
def test_an_exact_staircase_gives_its_tile(tile: int) -> None:
    assert detect_tile(TOKENS, staircase(tile)) == tile


@pytest.mark.parametrize("tile", [32, 64])
def test_a_noisy_staircase_gives_its_tile(tile: int) -> None:
    rng = np.random.default_rng(tile)
    clean = np.array(staircase(tile))
    noisy = clean * (1 + rng.normal(0, 0.002, clean.size))  # 0.2% timing noise, steps of 5-10%
    assert detect_tile(TOKENS, noisy.tolist()) == tile


def test_a_staircase_on_a_slope_gives_its_tile() -> None:
    """Steps of 64 over a gentle ramp (the weights' share of a call growing with rows)."""
    times = [s + 2e-9 * n for s, n in zip(staircase(64), TOKENS, strict=True)]
    assert detect_tile(TOKENS, times) == 64


@pytest.mark.parametrize("times", [
    [40e-6 + 1e-8 * n for n in TOKENS],  # linear: no steps
    [40e-6] * len(TOKENS),  # flat (memory-bound)
    (40e-6 * (1 + np.random.default_rng(0).normal(0, 0.01, len(TOKENS)))).tolist(),  # noise only
])
def test_no_staircase_gives_none(times: list[float]) -> None:
    assert detect_tile(TOKENS, times) is None


def test_a_single_step_is_not_a_staircase() -> None:
    tokens = list(range(1, 100))
    assert detect_tile(tokens, staircase(64, tokens)) is None  # one boundary of 64, none of 128


def test_a_step_off_the_grid_is_not_a_tile() -> None:
    """Steps every 48 tokens: no candidate's every boundary steps, or a step lies inside."""
    assert detect_tile(TOKENS, staircase(48)) is None


def test_the_series_must_be_consecutive() -> None:
    with pytest.raises(ValueError, match="consecutive"):
        detect_tile([1, 2, 4], [1.0, 2.0, 3.0])
