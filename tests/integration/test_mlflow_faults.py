"""MLflow under faults (docs/tracking.md): nothing is lost between the run directory and the store.

(a) a run dir's marker names the result.json it logged, so a changed result is logged again;
(b) resume=true logs a reused result that never reached the store;
(c) two processes opening a new sqlite store at once both get it;
(d) a hung server costs tracking.timeout_s and one warning line; the URI is checked before
    the run; MLflow's telemetry is off.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socketserver
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli.overrides import precheck
from harness.common.errors import HarnessError
from harness.common.files import write_json_atomic
from harness.job import mlflow_log as tracking
from harness.job.config import register_configs
from harness.job.mlflow_log import TrackingConfig
from harness.tracking.mlflow_store import TrackingUnavailable, open_store
from tests import process_wait
from tests.conftest import REPO
from tests.harness_cli import TINY, empty_store, harness_env, run_module, runs_of, sqlite_uri
from tests.integration.test_tracking import hand_made_result, typed

register_configs()

# ---------------------------------------------------------------- (a) the marker names its result


def test_a_changed_result_is_logged_again(tmp_path: Path) -> None:
    store = empty_store(tmp_path / "mlflow.db")
    uri = sqlite_uri(store)
    run_dir = tmp_path / "run"
    write_json_atomic(run_dir / "result.json", hand_made_result())
    first = tracking.log_run(typed(hand_made_result()), run_dir, TrackingConfig(uri=uri))
    marker = json.loads((run_dir / "mlflow.json").read_text())["runs"][0]
    assert marker["run_id"] == first and len(marker["result_digest"]) == 64
    assert tracking.is_logged(run_dir, uri)

    # a rerun into the same run dir while the store is down: a new result, the old marker
    changed = {**hand_made_result(), "metrics": {"tokens_per_s": 99.0}}
    write_json_atomic(run_dir / "result.json", changed)
    assert not tracking.is_logged(run_dir, uri)
    logged, present, failed = tracking.push([run_dir], tracking.TrackingConfig(uri=uri))
    assert (logged, present, failed) == (1, 0, 0)
    runs = runs_of(store)
    assert sorted(r.data.metrics["tokens_per_s"] for r in runs) == [99.0, 120.5]
    assert tracking.push([run_dir], tracking.TrackingConfig(uri=uri)) == (0, 1, 0)  # and only once


def test_a_marker_without_a_digest_still_counts_as_logged(tmp_path: Path) -> None:
    """Markers written before digests existed: their results are not logged twice."""
    run_dir = tmp_path / "run"
    write_json_atomic(run_dir / "result.json", hand_made_result())
    uri = sqlite_uri(tmp_path / "old.db")
    write_json_atomic(run_dir / "mlflow.json", {"runs": [{"uri": uri, "run_id": "r", "experiment_id": "0"}]})
    assert tracking.is_logged(run_dir, uri)


# ---------------------------------------------------------------- (b) resume logs what the store lacks


@pytest.mark.slow
def test_resume_logs_a_reused_result_missing_from_the_store(proxy_cache: Path, tiny_dir: Path, tmp_path: Path):
    """The first run's result.json is written but never logged (tracking off, as when a sweep
    is killed between the two); resume=true reuses it and logs it."""
    store = empty_store(tmp_path / "mlflow.db")
    first, second = tmp_path / "first", tmp_path / "second"
    proc = run_module("harness", [*TINY, "system=gpu_only", "tracking.enabled=false", f"hydra.run.dir={first}"],
                      proxy_cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_module("harness", [*TINY, "system=gpu_only", "resume=true", f"tracking.uri={sqlite_uri(store)}",
                                  f"hydra.run.dir={second}"], proxy_cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[skipped]" in proc.stdout
    runs = runs_of(store)
    assert [r.data.tags["run_dir"] for r in runs] == [str(first.resolve())]
    assert tracking.is_logged(first, sqlite_uri(store))


# ---------------------------------------------------------------- (c) a new store, opened twice at once


def _open_and_log(uri: str, barrier) -> str:
    from harness.tracking.mlflow_store import ensure_experiment

    barrier.wait()
    try:
        client = open_store(uri)
        experiment = ensure_experiment(client, "race", None)
        client.create_run(experiment)
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


@pytest.mark.slow
def test_processes_opening_a_new_store_together_all_get_it(tmp_path: Path) -> None:
    uri = sqlite_uri(tmp_path / "new" / "mlflow.db")
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(3)
        with context.Pool(3) as pool:
            outcomes = pool.starmap(_open_and_log, [(uri, barrier)] * 3)
    assert outcomes == ["ok"] * 3


# ---------------------------------------------------------------- (d) a hung server, the URI, telemetry


class HungServer(socketserver.ThreadingTCPServer):
    """Accepts connections and reads requests; answers /health only if `healthy`, and
    nothing else ever (until stopped)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, healthy: bool) -> None:
        self.healthy, self.stop = healthy, threading.Event()
        self.requests: list[str] = []  # request lines received
        super().__init__(("127.0.0.1", 0), HungHandler)

    def api_requests(self) -> list[str]:
        return [r for r in self.requests if r and " /health " not in r]

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class HungHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        request = self.rfile.readline().decode(errors="replace")
        self.server.requests.append(request.strip() and request)
        if self.server.healthy and " /health " in request:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
            return
        self.server.stop.wait(60)


@pytest.fixture(params=[False, True], ids=["hung", "health-only"])
def hung_server(request: pytest.FixtureRequest) -> Iterator[HungServer]:
    server = HungServer(healthy=request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stop.set()
    server.shutdown()
    server.server_close()


def test_a_server_that_never_answers_is_unavailable(tmp_path: Path) -> None:
    server = HungServer(healthy=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(TrackingUnavailable, match="no answer"):
            open_store(server.uri, timeout_s=1)
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


def test_a_hung_server_costs_one_warning_line(hung_server: HungServer, tmp_path: Path,
                                             capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hung from the start, or answering /health but hanging on the API (MLflow's own request
    timeout, tracking.timeout_s, then applies, without retries): the result stays, one
    warning, nothing on stdout, and at most one API request (MLflow used to retry)."""
    for key in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(key, raising=False)  # restored after the test, which sets them to 1 s and 0
    run_dir = tmp_path / "run"
    write_json_atomic(run_dir / "result.json", hand_made_result())
    cfg = TrackingConfig(uri=hung_server.uri, timeout_s=1)
    assert tracking.log_run(typed(hand_made_result()), run_dir, cfg) is None
    out, err = capfd.readouterr()
    assert out == ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: MLflow logging skipped"), err
    assert not (run_dir / "mlflow.json").exists()
    assert len(hung_server.api_requests()) == (1 if hung_server.healthy else 0), hung_server.requests
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "1"  # what MLflow waits per request from now on


def test_the_uri_is_checked_before_the_run() -> None:
    with pytest.raises(HarnessError, match=r"tracking\.uri='garbage://x'"):
        precheck(["model=tiny", "tracking.uri=garbage://x"])


@pytest.mark.slow
def test_telemetry_is_off_by_default(tmp_path: Path) -> None:
    """In a fresh process outside any test or CI environment (which MLflow itself treats as
    telemetry-free), opening a store leaves no MLflow files in the home directory."""
    env = {k: v for k, v in harness_env(tmp_path).items()
           if k not in ("PYTEST_CURRENT_TEST", "CI", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "XDG_CONFIG_HOME")}
    env["HOME"] = str(tmp_path / "home")
    code = ("import os; from harness.tracking.mlflow_store import open_store; "
            f"open_store('sqlite:///{tmp_path}/m.db').search_experiments(); "
            "print(os.environ['MLFLOW_DISABLE_TELEMETRY'])")
    proc = process_wait.run([sys.executable, "-c", code], "open_store", cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "true"
    assert not (tmp_path / "home" / ".config" / "mlflow").exists()
