"""harness/traces/repetition.py: greedy decode loops on hand-made token sequences."""

from __future__ import annotations

import pytest

from harness.traces.repetition import GENERATED_IDS, loop_length, repetition_statistics


def test_a_two_token_loop_to_the_end_is_found_with_its_first_cycle() -> None:
    ids = [5, 9, 2, 7, 3, 7, 3, 7, 3, 7, 3]  # "7 3" from position 3 to the end: 8 tokens
    assert loop_length(ids) == 8


def test_a_single_repeated_token_is_a_period_one_loop() -> None:
    assert loop_length([1, 2, 3, 4, 4, 4, 4]) == 4


def test_text_without_a_cycle_repeated_three_times_has_no_loop() -> None:
    assert loop_length([1, 2, 3, 4, 5, 6, 7, 8]) == 0
    assert loop_length([1, 2, 1, 2]) == 0  # two cycles only
    assert loop_length([]) == 0


def test_a_loop_that_ended_before_the_text_did_is_not_a_tail_loop() -> None:
    assert loop_length([7, 3, 7, 3, 7, 3, 1, 2, 9]) == 0


def test_the_statistics_over_requests() -> None:
    meta = {GENERATED_IDS: [[1, 2, 3, 4, 4, 4, 4, 4], [1, 2, 3, 4, 5, 6, 7, 8]]}
    got = repetition_statistics(meta)
    assert got["repetition_mean"] == pytest.approx((5 / 8 + 0) / 2)
    assert got["repetition_max"] == 5 / 8 and got["looping_requests"] == 0.5


def test_without_recorded_ids_every_figure_is_none() -> None:
    assert set(repetition_statistics({}).values()) == {None}
