"""One cell key for the whole report (harness/report/keys.py): every section and figure of
the report keys its rows as the main table does, so two runs that differ in one setting
stay two rows everywhere, and runs with the same settings are reported once, with one
warning naming both. The runs are copies of a real result.json (a replay of the committed
mini trace: tests/golden/mini/replay/result.json) changed one setting at a time."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from harness.placement.trace import RoutingTrace
from harness.report import breakdown, plots
from harness.report import tables as report
from harness.traces.routing_stats import routing_statistics
from tests.conftest import REPO
from tests.unit.test_report_keys import ONE_SETTING, write_runs

GOLDEN = REPO / "tests" / "golden" / "mini"
SECTIONS = ("cell", "DALI's measures", "Over the routing trace", "Decodes that stopped early",
            "Routing statistics (uniform", "Routing statistics of the replayed", "tau*: how flat",
            "Where the modeled time goes")


def replay(system: str = "tide", tau: Any = "auto", tokens_per_s: float | None = None) -> dict[str, Any]:
    """The committed replay result, as system (tau for tide), with DALI's measures added and a
    decode short of its tokens (the early-stop section)."""
    data = json.loads((GOLDEN / "replay" / "result.json").read_text())
    data["trace"] = data["config"]["trace"]["path"] = str(GOLDEN / "trace.npz")
    data["system"] = system
    data["config"]["system"] = {"name": system, **({"tau": tau} if system == "tide" else {})}
    if system != "tide":
        data["system_report"] = {}  # no tau curve
    data["metrics"].update(expert_hit_rate=0.5, gpu_busy_share=0.25, generated_tokens=30)
    if tokens_per_s is not None:
        data["metrics"]["tokens_per_s"] = tokens_per_s
    return data


def with_routing(data: dict[str, Any]) -> dict[str, Any]:
    """A live run's own routing recording (the routing statistics section)."""
    data["routing"] = routing_statistics(RoutingTrace.load(GOLDEN / "trace.npz"), 64)
    return data


def cell_runs(change: Any = None, scale: float = 1.0) -> list[dict[str, Any]]:
    """One cell: tide at tau auto (with its recording), 2 and 4 (a tau sweep), and fiddler."""
    runs = [with_routing(replay(tokens_per_s=20.0 * scale)), replay(tau=2, tokens_per_s=21.0 * scale),
            replay(tau=4, tokens_per_s=22.0 * scale), replay("fiddler", tokens_per_s=10.0 * scale)]
    for run in runs:
        if change is not None:
            change(run)
    return runs


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Path]]:
    """The figures the report draws, (figure, PNG path), kept in memory instead of written."""
    figures: list[tuple[Any, Path]] = []

    def keep(fig: Any, path: Path) -> Path:
        figures.append((fig, path))
        return path

    monkeypatch.setattr(plots, "_save", keep)
    monkeypatch.setattr(breakdown, "_save", keep)
    return figures


def section_rows(text: str) -> dict[str, int]:
    """Data rows (table lines past the header, or `- ` items) per section of report.md, the
    main table's under "cell"."""
    counts: dict[str, int] = {}
    title = "cell"
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if lines and lines[0].startswith("## "):
            title = lines[0][3:]
            continue
        if lines and lines[0].startswith("Over the routing trace"):
            title = lines[0]
            continue
        name = next((s for s in SECTIONS if title.startswith(s)), title)
        table = [ln for ln in lines if ln.startswith("|")]
        counts[name] = counts.get(name, 0) + (len(table) - 2 if table else sum(ln.startswith("- ") for ln in lines))
    return counts


def report_of(results: list[dict[str, Any]], root: Path, drawn: list[tuple[Any, Path]]
              ) -> tuple[dict[str, int], dict[str, int], list[float], list[str]]:
    """Rows per section, figures per kind (file name before its first `_`), the heights of
    the throughput figure's bars, and the same-key warnings."""
    records = report.records_from_dirs([write_runs(root / "runs", results)])
    keyed = report.keyed_runs(records)
    del drawn[:]
    text, _ = report.write_report(records, root / "out")
    kinds: dict[str, int] = {}
    heights: list[float] = []
    for fig, path in drawn:
        kind = path.name.split("_")[0].removesuffix(".png")
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "throughput":
            heights += [round(p.get_height(), 6) for ax in fig.axes for c in ax.containers
                        if type(c).__name__ == "BarContainer" for p in c.patches]
        plots.pyplot().close(fig)
    return section_rows(text), kinds, heights, keyed.warnings


def test_one_cell_fills_every_section_and_figure(tmp_path: Path, drawn: list[tuple[Any, Path]]) -> None:
    rows, kinds, heights, warnings = report_of(cell_runs(), tmp_path, drawn)
    assert set(rows) == set(SECTIONS) - {"Routing statistics of the replayed"}  # the row has a recording
    assert rows["cell"] == 1 and rows["DALI's measures"] == 4 and rows["tau*: how flat"] == 3  # tide's three
    assert rows["Where the modeled time goes"] == 4 and rows["Decodes that stopped early"] == 4
    assert kinds == {"throughput": 1, "tau": 1, "miss": 1, "breakdown": 1}
    assert sorted(h for h in heights if h) == [10.0, 20.0, 21.0, 22.0] and not warnings


@pytest.mark.parametrize("setting", sorted(ONE_SETTING))
def test_runs_differing_in_one_setting_stay_apart_in_every_section_and_figure(
        setting: str, tmp_path: Path, drawn: list[tuple[Any, Path]]) -> None:
    single, single_kinds, _, _ = report_of(cell_runs(), tmp_path / "one", drawn)
    rows, kinds, heights, warnings = report_of([*cell_runs(), *cell_runs(ONE_SETTING[setting], scale=2.0)],
                                               tmp_path / "two", drawn)
    assert not warnings
    assert rows == {name: 2 * n for name, n in single.items()}, setting
    # one throughput figure, its bars apart (below); the others one figure per row
    assert kinds == {kind: n if kind == "throughput" else 2 * n for kind, n in single_kinds.items()}, setting
    assert sorted(h for h in heights if h) == [10.0, 20.0, 20.0, 21.0, 22.0, 40.0, 42.0, 44.0]


def test_a_replay_row_gets_its_trace_statistics_once_per_row(tmp_path: Path, drawn: list[tuple[Any, Path]]) -> None:
    first = [replay(tokens_per_s=20.0), replay("fiddler", tokens_per_s=10.0)]
    second = [replay(tokens_per_s=40.0), replay("fiddler", tokens_per_s=20.0)]
    for run in second:
        ONE_SETTING["decode.threshold"](run)
    rows, _, _, _ = report_of([*first, *second], tmp_path, drawn)
    assert rows["Routing statistics of the replayed"] == 2 and "Routing statistics (uniform" not in rows


def test_the_same_settings_twice_are_reported_once_with_one_warning(tmp_path: Path,
                                                                     drawn: list[tuple[Any, Path]]) -> None:
    single, single_kinds, _, _ = report_of(cell_runs(), tmp_path / "one", drawn)
    rows, kinds, heights, warnings = report_of([*cell_runs(), *cell_runs(scale=2.0)], tmp_path / "two", drawn)
    assert rows == single and kinds == single_kinds
    assert sorted(h for h in heights if h) == [20.0, 40.0, 42.0, 44.0]  # the newer runs
    assert len(warnings) == 4 and all(w.count("\n") == 0 and "run" in w for w in warnings)  # one per system
    fiddler = next(w for w in warnings if "system=fiddler" in w)
    assert fiddler.index("using the newer") < fiddler.index("run7") < fiddler.index("leaving out the older") \
        < fiddler.index("run3")


def test_a_budget_setting_its_name_decides_is_no_key_of_its_own(tmp_path: Path,
                                                                 drawn: list[tuple[Any, Path]]) -> None:
    def at_18gb(run: dict[str, Any]) -> None:
        run["budget"] = {**run["budget"], "name": "18GB", "gpu_gb": 18.0, "experts_per_layer": 128}
        run["config"]["budget"].update(name="18GB", gpu_gb=18.0, experts_per_layer=128)

    records = report.records_from_dirs([write_runs(tmp_path, [*cell_runs(), *cell_runs(at_18gb)])])
    keyed = report.keyed_runs(records)
    assert keyed.settings == [] and keyed.keys == ["model", "gen_length", "block_length", "budget"]
    changed = copy.deepcopy(cell_runs(at_18gb))
    for run in changed:
        run["config"]["budget"]["gpu_gb"] = 17.0  # two 18GB runs now differ in it: a key again
    records = report.records_from_dirs([write_runs(tmp_path / "b", [*cell_runs(at_18gb), *changed])])
    assert report.keyed_runs(records).settings == ["budget.gpu_gb"]


def test_the_report_builds_no_pipe_table_by_hand() -> None:
    """Every markdown table of the report is tabulate's (harness/report/markdown.py): no module
    of the report joins cells with pipes or writes a --- separator row itself."""
    for path in (REPO / "harness" / "report").glob("*.py"):
        text = path.read_text()
        for pattern in ('" | "', '"|---', "'|---", '"| "', "| {"):
            assert pattern not in text, f"{path.name}: {pattern}"
