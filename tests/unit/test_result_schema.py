"""The documented result schema (docs/result-schema.md, harness/results/schema.py): the page
is current, every field and metric a run writes is documented with its unit, and the schema
version moves with the fields. Plus the environment a result records and the repeats of a
measured run (harness/hybrid/repeats.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.accounting.budget import BudgetConfig, resolve_budget
from harness.common.errors import HarnessError
from harness.hybrid.repeats import TimingConfig, percentile, repeat_figures, run_repeats
from harness.job.setup import versions
from harness.model.config import LLaDA2Config
from harness.results import schema, schema_fields
from harness.results.run_result import SCHEMA, RunIdentity, RunResult
from tests.conftest import REPO
from tests.golden.grid import NOT_REPEATABLE

GOLDEN = REPO / "tests" / "golden" / "results.json"


def test_the_page_is_generated_from_the_current_schema() -> None:
    assert schema.undocumented() == []
    stale = "docs/result-schema.md is stale: run python -m harness.results.schema write"
    assert schema.PAGE.read_text() == schema.render(), stale


def test_the_schema_version_moves_with_its_fields() -> None:
    assert schema.SCHEMA_FINGERPRINTS.get(SCHEMA) == schema.fingerprint(), (
        "the documented fields changed: bump SCHEMA in harness/results/run_result.py and record "
        f"SCHEMA_FINGERPRINTS[{SCHEMA + 1}] = {schema.fingerprint()!r} in harness/results/schema.py")
    assert RunResult(RunIdentity()).to_dict()["schema"] == SCHEMA


def test_a_new_field_changes_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    before = schema.fingerprint()
    monkeypatch.setitem(schema_fields.METRICS, "new_metric", ("s", "run", "a new figure"))
    assert schema.fingerprint() != before
    monkeypatch.delitem(schema_fields.METRICS, "new_metric")
    monkeypatch.setitem(schema_fields.METRICS, "tokens_per_s", ("tokens/min", "run", "a unit changed"))
    assert schema.fingerprint() != before


def test_every_metric_of_every_golden_cell_is_documented() -> None:
    cells = json.loads(GOLDEN.read_text())
    names = {k for cell in cells.values() for k in cell["metrics"]} | NOT_REPEATABLE
    assert len(names) > 50
    assert schema.undocumented_metrics(names) == []


def test_measured_and_routing_metrics_are_documented() -> None:
    measured = ["measured_time_s", "measured_host_plan_s", "gpu_peak_mem_gb", "modeled_tokens_per_s",
                "measured_tokens_per_s_p50", "measured_time_s_p90", "host_expert_bytes", "gpu_slots_high_water"]
    routing = ["routing_top_b_share", "routing_uniform_load_entropy", "routing_cosine_k3", "routing_uniform_cosine_k1"]
    assert schema.undocumented_metrics([*measured, *routing]) == []
    assert schema.undocumented_metrics(["routing_made_up", "nonsense"]) == ["nonsense", "routing_made_up"]


def test_the_budget_record_and_the_versions_are_documented() -> None:
    geometry = LLaDA2Config.published("llada2_mini")
    budget = resolve_budget(BudgetConfig(name="custom", gpu_gb=12.0, scope="global"), geometry).as_dict()
    assert set(budget) <= set(schema_fields.BUDGET_FIELDS)
    recorded = versions()
    assert set(recorded) <= set(schema_fields.VERSIONS_FIELDS)


def test_the_environment_names_cpu_ram_and_the_numeric_packages() -> None:
    recorded = versions()
    for key in ("cpu_model", "cpu_count", "ram_gb", "numpy", "numba", "mlflow", "os"):
        assert recorded[key], key
    assert recorded["numpy"] == np.__version__
    assert float(recorded["ram_gb"]) > 0 and int(recorded["cpu_count"]) >= 1


def test_percentiles_match_numpy() -> None:
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in (0, 10, 50, 90, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([7.0], 90) == 7.0 and math.isnan(percentile([], 50))


def test_warmup_is_discarded_and_only_the_last_repeat_records() -> None:
    calls: list[bool] = []

    def decode(last: bool) -> int:
        calls.append(last)
        return len(calls)

    kept = run_repeats(decode, TimingConfig(warmup=2, repeats=3))
    assert kept == [3, 4, 5] and calls == [False, False, False, False, True]


def test_repeat_figures_are_p50_and_p90() -> None:
    figures = repeat_figures([2.0, 1.0, 4.0], tokens=8, timing=TimingConfig(warmup=1, repeats=3))
    assert figures["measured_time_s_p50"] == 2.0 and figures["measured_time_s_p90"] == pytest.approx(3.6)
    assert figures["measured_tokens_per_s_p50"] == 4.0  # rates 4, 8, 2
    assert figures["measured_tokens_per_s_p90"] == pytest.approx(7.2)
    assert figures["measured_warmup"] == 1.0 and figures["measured_repeats"] == 3.0


@pytest.mark.parametrize(("warmup", "repeats", "needle"), [(-1, 3, "timing.warmup"), (1, 0, "timing.repeats")])
def test_bad_timing_is_a_one_line_error(warmup: int, repeats: int, needle: str) -> None:
    with pytest.raises(HarnessError, match=needle):
        TimingConfig(warmup=warmup, repeats=repeats)
