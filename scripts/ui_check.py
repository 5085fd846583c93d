"""Checks, in headless Chromium, what a user sees of a sweep in the MLflow UI (run by
scripts/ui_check.sh, which makes the sweep and serves the UI).

Each check prints one `ok:` or `FAILED:` line; `info:` lines report what was seen without
judging it. Screenshots go into --out. Exit status 1 if any check failed.

  the experiment carries the model-training kind tag                      (REST API)
  a new browser opening the bare experiment URL: which page (info; MLflow 3.17 picks it
    by the browser's GenAI / Model training switch, not by the tag)
  the link the harness prints opens the runs table, which lists the parent run (by its
    sweep name) and, expanded, every child, with the workload in the Dataset column
  that table (the saved view "Results (harness)") shows tokens/s, miss rate, tau* and
    lossless and the swept params as columns; the parent's name leads with what the sweep
    varies, every child's name carries its swept values
  each child's duration is its job's own (REST)
  the chart view of the children grouped by system and budget
  the parent run's page: its name, and the description with the command and summary table
  once the sidebar switch was set to "Model training", the bare experiment URL opens the runs table
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdp import Browser, BrowserError

from harness.tracking.mlflow_ui import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, runs_page_link

FAILURES: list[str] = []
ROWS = "[...document.querySelectorAll('[role=row]')]"
HEADING = "(document.querySelector('h2') || {}).innerText"
CHART_SEARCH = 'input[placeholder="Search metric charts"]'


def check(ok: bool, what: str, detail: str = "") -> bool:
    print(f"{'ok' if ok else 'FAILED'}: {what}{f' ({detail})' if detail else ''}", flush=True)
    if not ok:
        FAILURES.append(what)
    return ok


def rest(base: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def sweep_runs(base: str, experiment_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    runs = rest(base, "runs/search", {"experiment_ids": [experiment_id], "max_results": 100}).get("runs", [])

    def tags(run: dict[str, Any]) -> dict[str, str]:
        return {t["key"]: t["value"] for t in run["data"].get("tags", [])}

    parents = [r for r in runs if tags(r).get("harness.kind") == "sweep"]
    if len(parents) != 1:
        raise SystemExit(f"error: expected one sweep parent run, found {len(parents)}")
    children = [r for r in runs if tags(r).get("mlflow.parentRunId") == parents[0]["info"]["run_id"]]
    return parents[0], children


def row_texts(browser: Browser) -> list[str]:
    return list(browser.evaluate(f"{ROWS}.map(r => r.innerText.replace(/\\s+/g, ' '))") or [])


def close_assistant(browser: Browser) -> None:
    """The MLflow Assistant side panel covers a third of the page; close it if it is open."""
    found = browser.evaluate("!![...document.querySelectorAll('button')].find(b => b.getAttribute('aria-label') "
                             "== 'Close' && b.closest('[class]') && document.body.innerText.includes('MLflow "
                             "Assistant'))")
    if found:
        browser.click("[...document.querySelectorAll('button')].find(b => b.getAttribute('aria-label') == 'Close')",
                      "the assistant's close button")
        time.sleep(1)


def expand_parent(browser: Browser, parent_name: str, child_names: list[str]) -> None:
    """Show the children (the UI remembers an expanded parent between pages of a session)."""
    shown = f"{json.dumps(child_names)}.every(n => {ROWS}.some(r => r.innerText.includes(n)))"
    if not browser.evaluate(shown):
        browser.click(f"{ROWS}.find(r => r.innerText.includes({json.dumps(parent_name)})).querySelector('button')",
                      "the parent run's expand button")
    browser.wait_for(shown, "the children under the expanded parent", timeout_s=30)


def open_page(browser: Browser, url: str, ready: str, what: str) -> str:
    browser.navigate(url)
    browser.wait_for(ready, what)
    time.sleep(2)  # late layout (charts, column widths) before a screenshot
    return str(browser.evaluate("location.hash"))


def check_new_browser(browser: Browser, base: str, experiment_id: str, out: Path) -> None:
    landed = open_page(browser, f"{base}/#/experiments/{experiment_id}",
                       f"/Overview|Runs|Traces/.test({HEADING})", "the experiment page")
    browser.screenshot(out / "01-experiment-new-browser.png")
    page = browser.evaluate(HEADING)
    print(f"info: a new browser at #/experiments/{experiment_id} shows '{page}' ({landed})", flush=True)


def check_runs_table(browser: Browser, link: str, parent: dict[str, Any], children: list[dict[str, Any]],
                     out: Path) -> None:
    name = parent["info"]["run_name"]
    landed = open_page(browser, link, f"{ROWS}.some(r => r.innerText.includes({json.dumps(name)}))",
                       "the parent run in the runs table")
    check("/runs" in landed and browser.evaluate(HEADING) == "Runs", "the harness's link opens the runs table",
          landed.split("&")[0])
    close_assistant(browser)
    check(any(name in row for row in row_texts(browser)), "the runs table lists the parent run", name)
    child_names = [c["info"]["run_name"] for c in children]
    expand_parent(browser, name, child_names)
    rows = row_texts(browser)
    check(all(any(n in row for row in rows) for n in child_names), "expanded, it lists every child",
          ", ".join(sorted(child_names)))
    datasets = [d["dataset"] for c in children for d in c.get("inputs", {}).get("dataset_inputs", [])]
    labels = {f"{d['name']} ({d['digest']})" for d in datasets}
    check(len(datasets) == len(children) and all(any(lb in row for row in rows) for lb in labels),
          "the Dataset column shows each child's workload", ", ".join(sorted(labels)))


HEADERS = "[...document.querySelectorAll('.ag-header-cell')].map(e => e.innerText.trim()).filter(x => x)"
RESULT_COLUMNS = ("tokens_per_s", "miss_rate", "tau_star", "lossless")


def params_of(run: dict[str, Any]) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


def check_results_view(browser: Browser, parent: dict[str, Any], children: list[dict[str, Any]], swept: list[str],
                       out: Path) -> None:
    """The link's view (saved view "Results (harness)") shows the results and the swept params
    as columns, and the names carry the swept values. Runs on the page check_runs_table left
    open (the parent expanded)."""
    resize(browser, 3000)  # the grid renders only the columns in view: all of them, for reading
    time.sleep(2)
    headers = list(browser.evaluate(HEADERS) or [])
    resize(browser, 1440)
    missing = [c for c in RESULT_COLUMNS if c not in headers]
    check(not missing, "the link's runs table shows tokens/s, miss rate, tau* and lossless as columns",
          f"missing {missing}" if missing else ", ".join(headers))
    params = [f"{k}.name" if k in ("system", "budget", "model") else k for k in swept]
    check(all(p in headers for p in params), "it shows the swept params as columns", ", ".join(params))
    name = parent["info"]["run_name"]
    shown = " × ".join(f"{k}=" for k in swept)
    check(all(f"{k}=" in name.split(" · ")[0] for k in swept) and any(name[:40] in row for row in row_texts(browser)),
          "the parent's name leads with what the sweep varies", f"{name} (expected {shown}...)")
    rows = row_texts(browser)
    carried = []
    for child in children:
        values = [params_of(child).get(p) for p in params]
        carried.append(all(v is not None and v in child["info"]["run_name"] for v in values)
                       and any(child["info"]["run_name"] in row for row in rows))
    check(all(carried), "every child's name carries its swept values",
          ", ".join(c["info"]["run_name"] for c in children))
    resize(browser, 1920)  # wide enough for every result column in the screenshot
    time.sleep(2)
    browser.screenshot(out / "02-runs-table.png")
    resize(browser, 1440)


def resize(browser: Browser, width: int, height: int = 900) -> None:
    browser.command("Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, browser.session)


def check_job_durations(children: list[dict[str, Any]]) -> None:
    """The Duration column is each job's own time (REST: end - start >= the job's decode wall time)."""
    ok, shown = True, []
    for child in children:
        info = child["info"]
        metrics = {m["key"]: m["value"] for m in child["data"].get("metrics", [])}
        duration_s = (int(info["end_time"]) - int(info["start_time"])) / 1000
        ok &= duration_s >= metrics.get("wall_s", 0.0) > 0
        shown.append(f"{duration_s:.1f}s")
    check(ok, "each child's duration is its job's (at least its decode wall time)", ", ".join(shown))


def check_parent_page(browser: Browser, base: str, parent: dict[str, Any], out: Path) -> None:
    """The parent run's page: its full name and the description with the command and summary table."""
    info = parent["info"]
    open_page(browser, f"{base}/#/experiments/{info['experiment_id']}/runs/{info['run_id']}",
              "document.body.innerText.includes('Sweep command')", "the parent run's description")
    close_assistant(browser)
    browser.evaluate("(() => { const e = [...document.querySelectorAll('a,button,span')].find(x => "
                     "x.innerText && x.innerText.trim() == 'Show more'); if (e) e.click(); return !!e; })()")
    time.sleep(1)
    text = browser.text()
    check(info["run_name"] in text and "python -m harness -m" in text and "tok/s" in text,
          "the parent run's page shows its name, the sweep command and the summary table")
    browser.screenshot(out / "05-parent-run.png")


def choose_model_training(browser: Browser) -> None:
    """Click the sidebar's 'Model training' switch, as a user on the GenAI Overview would; the
    browser remembers the choice (localStorage `mlflow.workflowType`)."""
    clicked = browser.evaluate("(() => { const e = [...document.querySelectorAll('[role=button]')].find(b => "
                               "b.innerText.trim() == 'Model training'); if (e) e.click(); return !!e; })()")
    if not clicked:
        raise BrowserError("no 'Model training' switch in the sidebar")
    time.sleep(2)


def check_remembered_switch(browser: Browser, base: str, experiment_id: str, out: Path) -> None:
    browser.navigate("about:blank")
    landed = open_page(browser, f"{base}/#/experiments/{experiment_id}", f"/Overview|Runs|Traces/.test({HEADING})",
                       "the experiment page")
    check(browser.evaluate(HEADING) == "Runs",
          "once 'Model training' was chosen, the bare experiment URL opens the runs table", landed.split("&")[0])
    browser.screenshot(out / "03-experiment-after-switch.png")


def check_chart_view(browser: Browser, link: str, parent: dict[str, Any], children: list[dict[str, Any]],
                     out: Path) -> None:
    name = parent["info"]["run_name"]
    open_page(browser, f"{link}&compareRunsMode=CHART",
              f"{ROWS}.some(r => r.innerText.includes({json.dumps(name)})) && "
              f"!!document.querySelector('{CHART_SEARCH}')", "the chart view")
    close_assistant(browser)
    expand_parent(browser, name, [c["info"]["run_name"] for c in children])
    for tag in ("system", "budget"):  # the menu closes after each choice
        browser.click("[...document.querySelectorAll('button')].find(b => b.innerText.trim().startsWith('Group by'))",
                      "the Group by menu")
        time.sleep(1)
        item = f"[...document.querySelectorAll('[role=menuitemcheckbox]')].find(e => e.innerText.trim() == '{tag}')"
        browser.click(item, f"the tag {tag} in the Group by menu")  # tags are listed before params
        time.sleep(1)
        browser.command("Input.dispatchKeyEvent", {"type": "keyDown", "key": "Escape"}, browser.session)
    browser.click(f"document.querySelector('{CHART_SEARCH}')", "the chart search box")
    browser.type_text("tokens_per_s")
    time.sleep(3)
    groups = [r for r in row_texts(browser) if "Group:" in r]
    titles = browser.evaluate("document.body.innerText")
    check(len(groups) == len(children) and "system: " in titles and "budget: " in titles,
          "grouped by system and budget, the chart view shows one group per child", f"{len(groups)} groups")
    browser.screenshot(out / "04-chart-view.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the MLflow UI, e.g. http://127.0.0.1:5000")
    parser.add_argument("--experiment", default="llada2-mini")
    parser.add_argument("--out", type=Path, required=True, help="folder for the screenshots")
    parser.add_argument("--chromium", default="chromium")
    parser.add_argument("--swept", default="system,budget", help="the keys the sweep varied, comma-separated")
    args = parser.parse_args(argv)
    base = args.url.rstrip("/")
    args.out.mkdir(parents=True, exist_ok=True)

    found = rest(base, f"experiments/get-by-name?experiment_name={urllib.parse.quote(args.experiment)}")
    experiment = found["experiment"]
    kind = {t["key"]: t["value"] for t in experiment.get("tags", [])}.get(EXPERIMENT_KIND_TAG)
    check(kind == EXPERIMENT_KIND, f"the experiment is tagged {EXPERIMENT_KIND_TAG}={EXPERIMENT_KIND}", str(kind))
    parent, children = sweep_runs(base, experiment["experiment_id"])
    link = runs_page_link(base, experiment["experiment_id"])

    with tempfile.TemporaryDirectory(prefix="ui-check-profile-") as profile:
        browser = Browser(args.chromium, Path(profile))
        try:
            check_new_browser(browser, base, experiment["experiment_id"], args.out)
            choose_model_training(browser)
            check_runs_table(browser, link, parent, children, args.out)
            check_results_view(browser, parent, children, args.swept.split(","), args.out)
            check_job_durations(children)
            check_chart_view(browser, link, parent, children, args.out)
            check_parent_page(browser, base, parent, args.out)
            check_remembered_switch(browser, base, experiment["experiment_id"], args.out)
        except BrowserError as exc:
            check(False, "the browser session", str(exc))
            with contextlib.suppress(BrowserError):
                browser.screenshot(args.out / "failure.png")
        finally:
            browser.close()
    print(f"screenshots: {args.out}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
