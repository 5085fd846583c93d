"""A sweep's summary (harness/report/sweep.py): a readable table of the columns that differ
between jobs, with units; what every job shares in one line; no wall tokens/s beside a
modeled figure on proxies."""

from __future__ import annotations

import math
import re
from typing import Any

from harness.report.sweep import sweep_markdown, sweep_table


def job(i: int, system: str, tps: float, **changes: Any) -> dict[str, Any]:
    return {"job": i, "overrides": f"system={system}", "status": "ok", "system": system, "budget": "10GB",
            "model": "mini", "gen_length": 32, "block_length": 32, "decode_cache": "prefix", "tau": None,
            "tokens_per_s": tps, "miss_rate": 0.25, "io_gb": 1.5, "cpu_expert_tokens": 10, "tau_star": math.nan,
            "lossless": 1, "token_match_rate": 1.0, "wall_tokens_per_s": 3.0, "timing": "modeled",
            "weights": "random-proxy", **changes}


def test_the_summary_shows_what_differs_with_units_and_what_is_shared_once() -> None:
    text = sweep_markdown(sweep_table([job(0, "tide", 100.0), job(1, "fiddler", 50.0)]))
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header == ["job", "overrides", "system", "modeled tok/s", "miss rate", "host-to-GPU GB",
                      "CPU expert tokens", "token match"]
    assert text.count("\n| ") == 2  # a row per job
    assert "| 0 | system=tide | tide | 100.0 | 25.0% | 1.500 | 10 | 100.0% |" in re.sub(" +", " ", text)
    assert text.splitlines()[-1] == ("every job: status=ok, budget=10GB, model=mini, gen=32, block=32, cache=prefix, "
                                     "lossless=yes, timing=modeled, weights=random-proxy")
    assert "wall" not in text  # a proxy's wall speed ranks this CPU, not the modeled hardware


def test_real_weights_or_measured_runs_show_the_wall_figure() -> None:
    for change in ({"weights": "real"}, {"timing": "measured"}):
        text = sweep_markdown(sweep_table([job(0, "tide", 100.0, **change), job(1, "fiddler", 50.0, **change)]))
        assert "wall tok/s (this machine)" in text.splitlines()[0]
