"""Camera-ready figures (harness/report/plots.py): PNG at 300 dpi, PDF and SVG beside it,
error bars the 95% CI of the mean over prompts (or their spread), budgets side by side, no
text over other text, legends outside the axes, log2 axes for powers of two."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from harness.report import plots, uncertainty
from harness.results.records import per_prompt, record_from_result
from harness.results.run_result import DecodedOutputs, RunIdentity, RunResult, Timing

# two prompts: prompt 0 generates 4 tokens in 0.1 s of modeled time, prompt 1 4 tokens in 0.4 s
SERIES = [
    {"global_step": 0, "prompt": 0, "kind": "denoise", "block": 0, "step": 0, "routed_pairs": 10,
     "missed_pairs": 5, "miss_rate": 0.5, "modeled_latency_s": 0.05},
    {"global_step": 1, "prompt": 0, "kind": "denoise", "block": 0, "step": 1, "routed_pairs": 10,
     "missed_pairs": 1, "miss_rate": 0.1, "modeled_latency_s": 0.05},
    {"global_step": 2, "prompt": 1, "kind": "denoise", "block": 0, "step": 0, "routed_pairs": 20,
     "missed_pairs": 10, "miss_rate": 0.5, "modeled_latency_s": 0.4},
]


def run_result(system: str = "tide", tau: Any = "auto", budget: str = "10GB", tps: float = 100.0,
               miss: float = 0.3, tau_star: float | None = None) -> RunResult:
    config = {"model": {"name": "mini"}, "decode": {"gen_length": 32, "block_length": 32, "cache": "prefix"},
              "system": {"name": system, **({"tau": tau} if system == "tide" else {})}, "budget": {"name": budget}}
    metrics = {"tokens_per_s": tps, "miss_rate": miss, "io_gb": 0.1, "lossless": 1}
    if tau_star is not None:
        metrics["tau_star"] = tau_star
    return RunResult(RunIdentity(system=system, model="mini", weights="random-proxy", hardware="a100_pcie4",
                                 decode_cache="prefix"), config=config, budget={"name": budget},
                     metrics=metrics, timing=Timing("modeled"), step_series=[dict(p) for p in SERIES],
                     decoded=DecodedOutputs(outputs=[{"n_generated": 4}, {"n_generated": 4}]))


def test_per_prompt_figures_come_from_the_step_series() -> None:
    rows = per_prompt(run_result())
    assert [r["tokens_per_s"] for r in rows] == pytest.approx([4 / 0.1, 4 / 0.4])
    assert [r["miss_rate"] for r in rows] == pytest.approx([6 / 20, 10 / 20])
    record = record_from_result(run_result(), "x")
    assert plots.spread(record, "tokens_per_s") == pytest.approx(statistics.stdev([40.0, 10.0]))
    measured = run_result()
    measured.timing = Timing("measured")  # modeled step latencies are no measured per-prompt throughput
    assert all(math.isnan(r["tokens_per_s"]) for r in per_prompt(measured))
    assert math.isnan(plots.spread({"per_prompt": []}, "tokens_per_s"))


def test_powers_of_two() -> None:
    assert plots.powers_of_two([1, 2, 4, 8, 16])
    assert not plots.powers_of_two([1, 2, 3])
    assert not plots.powers_of_two([4])  # one value is no axis
    assert not plots.powers_of_two([2, "auto"])


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plots draw, kept open for inspection (still written to disk)."""
    drawn: list[Any] = []
    save = plots._save

    def keep(fig: Any, path: Path) -> Path:
        drawn.append(fig)  # pyplot forgets a closed figure; its axes stay readable here
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return drawn


def _legend_outside(ax: Any) -> bool:
    legend = ax.get_legend()
    return legend is not None and legend.get_bbox_to_anchor().x0 >= ax.get_window_extent().x1 - 1


def test_throughput_bars_have_error_bars_and_an_outside_legend(tmp_path: Path, figures: list[Any]) -> None:
    records = [record_from_result(run_result(s, tps=t), f"{s}") for s, t in (("fiddler", 50.0), ("tide", 100.0))]
    png = plots.throughput_by_budget(records, tmp_path / "throughput.png")
    assert [p.name for p in plots.figure_files(png)] == ["throughput.png", "throughput.pdf", "throughput.svg"]
    assert all(p.stat().st_size > 0 for p in plots.figure_files(png))
    (ax,) = figures[0].axes
    bars = [c for c in ax.containers if type(c).__name__ == "BarContainer" and c.errorbar is not None]
    assert len(bars) == 2  # each system's bar carries its spread across prompts
    assert _legend_outside(ax)
    from PIL import Image

    with Image.open(png) as image:
        assert round(image.info["dpi"][0]) == plots.DPI


def test_tau_sweep_uses_a_log2_axis_with_error_bars(tmp_path: Path, figures: list[Any]) -> None:
    runs = [run_result(tau=str(t), tps=100.0 + t, miss=0.5 - t / 100) for t in (1, 2, 4, 8)]
    runs.append(run_result(tau="auto", tau_star=4))
    records = [record_from_result(r, f"r{i}", order=i) for i, r in enumerate(runs)]
    (png,) = plots.tau_sweeps(records, tmp_path)
    assert png.with_suffix(".pdf").is_file() and png.with_suffix(".svg").is_file()
    top, bottom = figures[0].axes
    assert bottom.get_xscale() == "log" and top.get_xscale() == "log"  # shared x
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["1", "2", "4", "8"]
    assert all(_legend_outside(ax) for ax in (top, bottom))
    assert any(type(c).__name__ == "ErrorbarContainer" and c.has_yerr for c in top.containers)


def test_tau_sweep_with_other_taus_stays_linear(tmp_path: Path, figures: list[Any]) -> None:
    records = [record_from_result(run_result(tau=str(t)), f"r{t}", order=t) for t in (1, 3, 5)]
    plots.tau_sweeps(records, tmp_path)
    assert figures[0].axes[1].get_xscale() == "linear"


def test_the_t_quantiles_are_students() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in [*range(1, 31), 35, 40, 50, 60, 90, 120, 500, 10_000]:
        assert uncertainty.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3), df


def test_the_interval_is_of_the_mean_over_prompts() -> None:
    record = record_from_result(run_result(), "x")  # prompts at 40 and 10 tokens/s
    sd = statistics.stdev([40.0, 10.0])
    assert uncertainty.half_width(record, "tokens_per_s") == pytest.approx(12.706 * sd / math.sqrt(2))
    assert uncertainty.half_width(record, "tokens_per_s", "sd") == pytest.approx(sd)
    text = uncertainty.caption("ci", [record])
    assert "95% CI of the mean over prompts (Student t, n = 2 prompts)" in text
    assert "not repeated runs" in text


def overlapping_texts(fig: Any) -> list[tuple[str, str]]:
    """The pairs of visible, non-empty texts of the figure, rendered by Agg (as its PNG is),
    whose boxes intersect."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(fig)  # the figure was written and closed: draw it again, as the PNG
    canvas.draw()
    renderer = canvas.get_renderer()
    ticks = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for tick in axis.get_major_ticks()
             for t in (tick.label1, tick.label2)}
    drawn = {id(tick.label1) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for tick in axis._update_ticks()}  # the ticks within the view, the ones Agg draws
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and (id(t) not in ticks or id(t) in drawn)]
    return [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]


def test_budgets_side_by_side_with_ci_bars_and_no_overlapping_text(tmp_path: Path, figures: list[Any]) -> None:
    records = []
    for i, (budget, threshold) in enumerate([(b, t) for b in ("10GB", "18GB", "30GB") for t in (0.9, 0.95)]):
        for system, tps in (("fiddler", 50.0), ("mixtral_offload", 60.0), ("tide", 100.0)):
            result = run_result(system, budget=budget, tps=tps + i)
            result.config["decode"]["threshold"] = threshold  # a setting that differs: two panels
            result.config["hardware"] = {"name": "a100_pcie4", "notes": "a long description " * 6}
            records.append(record_from_result(result, f"{system}{i}", order=i))
    png = plots.throughput_by_budget(records, tmp_path / "throughput.png")
    assert png.is_file()
    fig = figures[0]
    assert len(fig.axes) == 2  # one panel per decode.threshold, not per budget
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["10GB", "18GB", "30GB"]  # budgets side by side
        assert ax.get_legend_handles_labels()[1] == ["fiddler", "mixtral_offload", "tide"]
        bars = [c for c in ax.containers if type(c).__name__ == "BarContainer"]
        assert all(c.errorbar is not None for c in bars)
        (caps, ) = bars[0].errorbar.lines[2]  # the CI's half width: t * s / sqrt(n) over the 2 prompts
        segment = caps.get_segments()[0]
        assert segment[1][1] - segment[0][1] == pytest.approx(
            2 * 12.706 * statistics.stdev([40.0, 10.0]) / math.sqrt(2), rel=1e-6)
    assert "95% CI of the mean over prompts" in fig._suptitle.get_text().replace("\n", " ")
    assert overlapping_texts(fig) == []


def test_the_spread_is_an_option(tmp_path: Path, figures: list[Any]) -> None:
    records = [record_from_result(run_result(s, tps=t), s) for s, t in (("fiddler", 50.0), ("tide", 100.0))]
    plots.throughput_by_budget(records, tmp_path / "throughput.png", errors="sd")
    assert "±1 s.d. across prompts" in figures[0]._suptitle.get_text().replace("\n", " ")


def test_the_tau_sweep_has_no_overlapping_text(tmp_path: Path, figures: list[Any]) -> None:
    runs = [run_result(tau=str(t), tps=100.0 + t, miss=0.5 - t / 100) for t in (1, 2, 4, 8)]
    runs.append(run_result(tau="auto", tau_star=4))
    plots.tau_sweeps([record_from_result(r, f"r{i}", order=i) for i, r in enumerate(runs)], tmp_path)
    assert overlapping_texts(figures[0]) == []


def test_the_overlap_check_sees_text_over_text() -> None:
    fig = plots.pyplot().figure()
    fig.text(0.5, 0.5, "one label")
    fig.text(0.5, 0.5, "another label")
    assert overlapping_texts(fig) == [("one label", "another label")]
    plots.pyplot().close(fig)
