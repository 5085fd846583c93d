"""The report's DALI section shows the phases the runs have: prefill / decode for an
autoregressive model, prefill / denoise / commit for block diffusion."""

from __future__ import annotations

from harness.report.measures import by_phase, phases_in


def test_an_autoregressive_run_shows_prefill_and_decode() -> None:
    m = {"expert_hit_rate": 0.5, "expert_hit_rate_prefill": 0.25, "expert_hit_rate_decode": 0.75}
    shown = phases_in([m])
    assert shown == ["prefill", "decode"]
    assert by_phase(m, "expert_hit_rate", shown) == "50.0% (25.0% / 75.0%)"


def test_a_block_diffusion_run_shows_its_own_phases_not_empty_decode_columns() -> None:
    m = {"expert_hit_rate": 0.5, "expert_hit_rate_prefill": 1.0, "expert_hit_rate_denoise": 0.4,
         "expert_hit_rate_commit": 0.6}
    shown = phases_in([m])
    assert shown == ["prefill", "denoise", "commit"]
    assert by_phase(m, "expert_hit_rate", shown) == "50.0% (100.0% / 40.0% / 60.0%)"


def test_a_run_without_phases_shows_its_figure_alone() -> None:
    assert by_phase({"expert_hit_rate": 0.125}, "expert_hit_rate", []) == "12.5%"
