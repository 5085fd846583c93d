"""The regime map's decision rules on hand-made figures (harness/regimes/maps.py): the winner,
margins over the best baseline, winner flips between neighbours, and each paper claim's test."""

from __future__ import annotations

import itertools

import pytest

from harness.regimes.grid import LOCALITY, MULTI, SHARED, SINGLE, SKEW, Cell, points
from harness.regimes.maps import claims, flips, lead, margin, winner
from harness.routing.params import RoutingRegime


def cell(point: dict[str, float], tps: dict[str, float], **extra: dict[str, float]) -> Cell:
    figures = {s: {"tokens_per_s": tps.get(s, 1.0), "miss_rate": 0.5, "modeled_time_s": 1.0, "tau_star": -1.0}
               for s in (*SINGLE, *MULTI)}
    for system, values in extra.items():
        figures[system.replace("__", "/")].update(values)
    return Cell("f", point, figures)


def test_the_winner_excludes_the_oracle_and_margins_are_over_the_best_baseline() -> None:
    c = cell({}, {"oracle": 50.0, "tide": 6.0, "fiddler": 4.0, "static_split": 5.0})
    assert winner(c) == "tide"
    assert margin(c, "tide") == pytest.approx(0.2) and margin(c, "fiddler") == pytest.approx(-0.2)
    assert lead(c) == pytest.approx(6.0 / 5.0 - 1)  # over static_split, the runner-up; never the oracle


def test_flips_name_the_neighbouring_points_whose_winner_differs() -> None:
    cells = [cell({"shared": sh, "skew": sk, "locality": lo}, {"tide": 2.0 if lo >= 0.6 else 0.5})
             for sh, sk, lo in itertools.product(SHARED, SKEW, LOCALITY)]
    found = flips(cells)
    assert len(found) == len(SHARED) * len(SKEW)  # one flip per row, between locality 0.3 and 0.6
    assert all("locality=0.6" in f and "-> tide" in f for f in found)


def test_each_paper_claim_holds_only_where_its_rule_says() -> None:
    c = cell({}, {"tide": 3.0, "fiddler": 2.0}, tide={"tau_star": 4.0}, dali={"miss_rate": 0.3},
             mixtral_offload={"miss_rate": 0.4}, gem__low={"modeled_time_s": 0.92},
             gem__high={"modeled_time_s": 0.80})
    verdict = claims(c)
    assert verdict["dali_holds"] and verdict["dali_hit_rise"] == pytest.approx(0.1)
    assert verdict["gem_holds"] and verdict["gem_gain_low"] == pytest.approx(0.08)
    assert verdict["tide_holds"]
    c.figures["tide"]["tau_star"] = 8.0  # the gain stays, tau* leaves 3..6
    c.figures["gem/high"]["modeled_time_s"] = 0.9  # 10% < 16.5%
    verdict = claims(c)
    assert not verdict["tide_holds"] and not verdict["gem_holds"]


def test_the_grid_is_4_by_3_by_2_plus_the_anchor() -> None:
    grid = points(RoutingRegime(locality=0.42))
    assert len(grid) == 25 and grid[-1] == {"locality": 0.42, "skew": 1.0, "shared": 0.5, "anchor": 1.0}


def test_bad_options_are_one_line_errors_before_any_work(tmp_path) -> None:
    from harness.common.errors import HarnessError
    from harness.regimes.__main__ import main

    with pytest.raises(HarnessError, match="families='nope': use some of mini"):
        main(["families=nope", f"out={tmp_path}"])
    with pytest.raises(HarnessError, match=r"jobs='two' must be a whole number >= 0"):
        main(["families=mixtral", "jobs=two", f"out={tmp_path}"])
    assert not any(tmp_path.iterdir())
