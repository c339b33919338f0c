"""The web console in real headless Chromium (Debian's, driven by Playwright's Python package;
``scripts/chromium.sh``): ``shoal ui`` over the embedded default and the console that ``shoal
server`` mounts at ``/console`` with token login, each a real process on loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import shoal
from helpers import FakeClock, cli_test_session, wait_until
from shoal import RemoteExecutor
from shoal.core import JobSpec, JobStatus
from shoal.core.endpoints import EndpointConfig, EndpointInstance, InstanceStatus
from shoal.core.experiments import MetricPoint, run_owner

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Read at import, before the autouse clean_env fixture strips SHOAL_* variables.
_CHROMIUM = os.environ.get("SHOAL_TEST_CHROMIUM") or shutil.which("chromium") or ""
HOSTILE = "<script>window.pwned=1</script><img src=x onerror=window.pwned=2>"
WAIT = 30.0  # seconds: generous, for a loaded machine (bounded polls, never sleeps)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not _CHROMIUM:
        pytest.fail("no Chromium for the console's browser tests: run scripts/chromium.sh "
                    "(installs Debian's chromium) or set SHOAL_TEST_CHROMIUM")
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=_CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Tab:
    """A browser page that records every console error and uncaught exception."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def goto(self, url: str) -> Any:
        response = self.page.goto(url)
        self.page.wait_for_load_state("load")
        return response

    def clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.page.evaluate("window.pwned") is None  # nothing injected ran


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT * 1000)
    found = Tab(page)
    page.on("console", lambda m: found.errors.append(f"console: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: found.errors.append(f"page error: {e}"))
    try:
        yield found
    finally:
        context.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _up(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"shoal ui exited with {proc.returncode}: "
                           f"{log.read_text(errors='replace')[-2000:]}")
    with urllib.request.urlopen(f"{url}/static/console.css", timeout=2) as r:
        return r.status == 200


@pytest.fixture
def ui(clean_env: Path, tmp_path: Path) -> Iterator[str]:
    """``shoal ui`` on a free loopback port over the test's SHOAL_HOME."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "ui", "--port", str(port)],
                                env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: _up(url, proc, log), 60, what=f"shoal ui at {url}")
        yield url
    finally:
        _stop(proc)


@pytest.fixture
def session(clean_env: Path) -> Iterator[shoal.Session]:
    with cli_test_session(clean_env) as s:
        yield s


def _non_blank_pixels(tab: Tab, selector: str) -> int:
    return int(tab.page.evaluate("""(sel) => {
        const canvas = document.querySelector(sel + " canvas");
        const ctx = canvas.getContext("2d");
        const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
        let n = 0;
        for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) n++;
        return n;
    }""", selector))


@contextmanager
def _metrics_server() -> Iterator[int]:
    """A real HTTP server on loopback answering ``/metrics`` as a model server does (its
    ``ServerMetrics``: three requests before any invocation, two waiting) and echoing
    ``POST /invocations``, each counted in its metrics (10 ms); yields its port."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pytest.importorskip("prometheus_client")
    from shoal.serving.metrics import ServerMetrics

    metrics = ServerMetrics(queue_depth=lambda: 2.0, loaded=lambda: 1.0)
    for status, seconds in ((200, 0.01), (200, 0.01), (500, 0.04)):
        metrics.request(status, seconds)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = metrics.render()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", ServerMetrics.content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            sent = self.rfile.read(int(self.headers["Content-Length"]))
            answer = b'{"echo": ' + sent + b', "type": "' + \
                self.headers["Content-Type"].encode() + b'"}'
            metrics.request(200, 0.01)
            self.send_response(200 if self.path == "/invocations" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_an_endpoints_page_draws_its_request_rate_and_latency_live(ui, session, tab):
    store = session.metadata
    with _metrics_server() as port:
        store.create_endpoint("busy", model_data="file:///models/m1",
                              config=EndpointConfig(instance_count=1))
        store.put_endpoint_instance("busy", EndpointInstance(
            0, "127.0.0.1", port, status=InstanceStatus.IN_SERVICE))
        tab.goto(f"{ui}/endpoints/busy")
        tab.page.wait_for_function("() => Number(document.querySelector('#load')"
                                   ".dataset.points) >= 1")  # two scrapes: one interval
        assert float(tab.page.get_attribute("#load", "data-last-rate")) == 0.0  # idle
        sent = 0

        def invoke(times: int = 5) -> None:
            nonlocal sent
            for _ in range(times):  # traffic, straight to the instance, as a client would
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/invocations", data=b"[1]", method="POST",
                    headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=10) as r:
                    assert r.status == 200
                sent += 1

        def invoked_and_drawn() -> bool:
            invoke()
            return float(tab.page.get_attribute("#load", "data-last-rate") or 0) > 0

        wait_until(invoked_and_drawn, WAIT, interval=0.5,
                   what="the rate chart to show the requests")
        assert _non_blank_pixels(tab, "#rate-chart") > 100
        assert _non_blank_pixels(tab, "#latency-chart") > 100
        tab.page.wait_for_function(  # the next poll has every request in the totals
            f"() => document.querySelector('#load-now').textContent.includes('{3 + sent} "
            "requests')")
        tab.clean()
        served = tab.page.request.get(f"{ui}/endpoints/busy/load").json()
        timed = [v for v in served["latency_ms"] if v is not None]
        assert timed and all(abs(v - 10.0) < 1e-6 for v in timed)
        assert served["rate"][-1] >= 0.0 and len(served["t"]) == len(served["rate"])

        tab.goto(f"{ui}/endpoints")  # the list shows the latest rate too, refreshed live
        rate = "#endpoints tbody tr td.rate"

        def listed_rate() -> bool:
            invoke()
            return float(tab.page.inner_text(rate) or 0) > 0

        wait_until(listed_rate, WAIT, interval=0.5, what="the list to show a rate")
        tab.clean()


def _seed_runs(session: shoal.Session) -> None:
    runs = session.runs
    runs.ensure_experiment("exp-a")
    for i, lr in enumerate((0.1, 0.01)):
        runs.create_run("exp-a", f"run-{i}")
        runs.set_run_parameters("exp-a", f"run-{i}", {"lr": lr, "note": HOSTILE})
        runs.add_metrics(run_owner("exp-a", f"run-{i}"), [
            MetricPoint("loss", 1.0 / (step + 1) + (5.0 if step == 7777 else 0.0),
                        1_700_000_000.0 + step, step) for step in range(20_000)])


def test_pages_load_clean_escape_values_and_draw_a_thinned_chart(ui, session, tab):
    _seed_runs(session)
    session.metadata.create_job(JobSpec(name=f"esc-{HOSTILE}", environment_variables={
        "API_TOKEN": "tok-very-secret", "PLAIN": "visible"}), key_salt="s", backend="local")
    session.metadata.update_job(f"esc-{HOSTILE}", status=JobStatus.FAILED, reason=HOSTILE)

    tab.goto(f"{ui}/jobs")
    row = tab.page.locator("#jobs tbody tr").first
    assert row.locator("td").first.inner_text() == f"esc-{HOSTILE}"  # shown as text
    row.locator("a").click()
    tab.page.wait_for_selector("#spec")
    assert tab.page.inner_text("#job-name") == f"esc-{HOSTILE}"
    assert tab.page.inner_text("#job-status .reason") == HOSTILE
    spec = tab.page.inner_text("#spec")
    assert "visible" in spec and "tok-very-secret" not in spec and "****" in spec
    assert "tok-very-secret" not in tab.page.content()
    tab.clean()

    store = session.metadata
    with _metrics_server() as port:
        store.create_endpoint(f"ep-{HOSTILE}", model_data="file:///models/m1",
                              config=EndpointConfig(instance_count=2))
        store.put_endpoint_instance(f"ep-{HOSTILE}", EndpointInstance(
            0, "127.0.0.1", port, status=InstanceStatus.IN_SERVICE))
        tab.page.click("header nav >> text=Endpoints")
        cells = tab.page.locator("#endpoints tbody tr").first.locator("td").all_inner_texts()
        tab.page.locator("#endpoints tbody tr a").first.click()
        tab.page.fill("#invoke-form textarea", '{"x": "<b>bold</b>"}')
        tab.page.click("#invoke")
        tab.page.wait_for_selector("#answer")
        assert tab.page.inner_text("#answer-status").startswith("HTTP 200")
        assert tab.page.inner_text("#answer") == \
            '{"echo": {"x": "<b>bold</b>"}, "type": "application/json"}'  # as text
    assert cells[0] == f"ep-{HOSTILE}" and cells[4] == "1 / 2"
    assert f"http://127.0.0.1:{port}" in cells[5]
    assert "3 requests · 20.0 ms · 2 queued" in cells[5]  # from the instance's /metrics
    tab.clean()
    tab.page.click("header nav >> text=Environments")
    tab.page.wait_for_selector("#environments")
    assert tab.page.locator("header nav >> text=Users").count() == 0  # no sign-in here
    tab.clean()

    tab.goto(f"{ui}/experiments")
    tab.page.click("text=exp-a")
    table = tab.page.locator("#runs")
    assert table.locator("tbody tr td:nth-child(2)").all_inner_texts() == ["run-1", "run-0"]
    assert HOSTILE in table.inner_text()  # the parameter, as text
    assert "0.01" in table.inner_text()  # parameters and last metrics are columns
    table.locator("input[name=run]").nth(0).check()
    table.locator("input[name=run]").nth(1).check()
    tab.page.select_option("#compare-form select[name=metric]", "loss")
    tab.page.click("#compare-form button")
    tab.page.wait_for_selector("figure#compare[data-drawn='2']")  # both runs on one chart
    assert tab.page.locator("#compare .u-legend .u-series").count() == 3  # x, then one a run
    assert _non_blank_pixels(tab, "figure#compare") > 100
    tab.page.check("#log-y")  # redrawn on a log scale
    tab.page.wait_for_function("() => document.querySelector('#compare').chart"
                               ".scales.y.distr === 3")
    with tab.page.expect_navigation():
        tab.page.click("#x-time")  # the same runs with time on x
    tab.page.wait_for_selector("figure#compare[data-drawn='2']")
    assert tab.page.evaluate("document.querySelector('#compare').chart.scales.x.time") is True
    assert tab.page.locator("#compare .u-legend .u-series").count() == 3
    assert _non_blank_pixels(tab, "figure#compare") > 100
    tab.clean()

    tab.goto(f"{ui}/experiments/exp-a")
    tab.page.click("text=run-1")
    chart = "figure.chart[data-metric='loss']"
    tab.page.wait_for_selector(f"{chart}[data-drawn='1']")
    width = tab.page.evaluate(f"document.querySelector(\"{chart}\").clientWidth")
    points = int(tab.page.get_attribute(chart, "data-points"))
    assert 0 < points <= 2 * width < 20_000  # thinned on the server to the chart's width
    assert _non_blank_pixels(tab, chart) > 100
    tab.clean()

    from shoal.experiments import Run

    with Run("exp-a", "graphs", sagemaker_session=session) as run:
        run.log_confusion_matrix([0, 0, 1, 1, 1], [0, 1, 1, 1, 0], title="confusion")
        run.log_roc_curve([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8], title="roc")
        run.log_precision_recall([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8], title="pr")
    tab.goto(f"{ui}/experiments/exp-a/runs/graphs")
    cells = tab.page.locator("figure.matrix[data-graph='confusion'] td").all_inner_texts()
    assert cells == ["1", "1", "1", "2"]  # rows: true 0, 1; columns: predicted 0, 1
    for curve in ("roc", "pr"):
        figure = f"figure.graph[data-metric='{curve}']"
        tab.page.wait_for_selector(f"{figure}[data-drawn='1']")
        assert _non_blank_pixels(tab, figure) > 100
    assert "AUC 0.750" in tab.page.inner_text("figure.graph[data-metric='roc'] .u-legend")
    tab.clean()

    # the spike at step 7777 survives the thinning
    with urllib.request.urlopen(f"{ui}/series?owner=run:exp-a/run-1&name=loss&width=300") as r:
        import json

        served = json.loads(r.read())["series"][0]
    assert served["points"] == 20_000 and len(served["x"]) <= 600
    assert max(served["y"]) > 5.0
    missing = tab.goto(f"{ui}/experiments/exp-a/compare?metric=loss&run=run-0&run=nope")
    assert missing.status == 404
    assert "no run 'nope'" in tab.page.inner_text("#error-message")


def test_filters_change_the_rows_and_pages_follow(ui, session, tab):
    store = session.metadata
    for i in range(55):  # ended, so that the session's clean-up has nothing to stop
        store.create_job(JobSpec(name=f"bulk-{i:02d}"), key_salt="s", backend="local")
        store.update_job(f"bulk-{i:02d}", status=JobStatus.STOPPED)
    store.create_job(JobSpec(name="lonely-failure"), key_salt="s", backend="local")
    store.update_job("lonely-failure", status=JobStatus.FAILED, reason="it broke")

    store.create_job(JobSpec(name="live-one"), key_salt="s", backend="local")
    tab.goto(f"{ui}/jobs?name=live-one")
    status = "#jobs tr[data-job='live-one'] .status"
    assert tab.page.inner_text(status) == "pending"
    store.update_job("live-one", status=JobStatus.STOPPED)  # no reload: the rows poll
    tab.page.wait_for_function(f"() => document.querySelector(\"{status}\").textContent "
                               "=== 'stopped'")

    tab.goto(f"{ui}/jobs")
    assert tab.page.locator("#jobs tbody tr").count() == 50  # one page
    tab.page.select_option("select[name=status]", "failed")
    tab.page.click("#job-filters button")
    tab.page.wait_for_url("**status=failed**")
    names = tab.page.locator("#jobs tbody tr td:first-child").all_inner_texts()
    assert names == ["lonely-failure"]

    tab.page.select_option("select[name=status]", "")
    tab.page.select_option("select[name=age]", "1h")  # all were created just now
    tab.page.fill("input[name=name]", "bulk-")
    tab.page.click("#job-filters button")
    tab.page.wait_for_url("**age=1h**")
    first = tab.page.locator("#jobs tbody tr td:first-child").all_inner_texts()
    tab.page.click("#next-page")
    tab.page.wait_for_url("**after=**")
    rest = tab.page.locator("#jobs tbody tr td:first-child").all_inner_texts()
    assert tab.page.locator("#first-page").count() == 1
    assert len(first) == 50 and len(rest) == 5
    assert sorted(first + rest) == [f"bulk-{i:02d}" for i in range(55)]  # no gap, no repeat
    tab.clean()

    session.runs.ensure_experiment("many")
    for i in range(51):
        session.runs.create_run("many", f"r{i:02d}")
        session.runs.set_run_parameters("many", f"r{i:02d}", {"rank": (i * 7) % 51})
    tab.goto(f"{ui}/experiments/many")
    runs = "#runs tbody tr td:nth-child(2)"
    assert tab.page.locator(runs).all_inner_texts() == [f"r{i:02d}" for i in range(50, 0, -1)]
    tab.page.click("#next-page")
    tab.page.wait_for_url("**page=2")
    assert tab.page.locator(runs).all_inner_texts() == ["r00"]
    tab.clean()
    tab.goto(f"{ui}/experiments/many")
    tab.page.select_option("#run-filters select[name=sort]", "param:rank")
    tab.page.select_option("#run-filters select[name=order]", "asc")
    tab.page.click("#run-filters button")
    tab.page.wait_for_url("**sort=param%3Arank**")
    ranked = tab.page.locator(runs).all_inner_texts()
    assert ranked[:3] == ["r00", "r22", "r44"]  # rank 0, 1, 2 (i * 7 % 51)
    tab.page.fill("#run-filters input[name=name]", "r5")
    tab.page.click("#run-filters button")
    tab.page.wait_for_url("**name=r5**")
    assert tab.page.locator(runs).all_inner_texts() == ["r50"]
    tab.clean()

    # By a last metric value: score (i * 13) % 51 of all runs but r01 and r26, after an
    # earlier point of the opposite order (the last one counts, not the first).
    for i in range(51):
        if i % 25 != 1:
            score = float((i * 13) % 51)
            session.runs.add_metrics(run_owner("many", f"r{i:02d}"), [
                MetricPoint("score", 100.0 - score, 1_700_000_000.0, 0),
                MetricPoint("score", score, 1_700_000_100.0, 1)])
    tab.goto(f"{ui}/experiments/many")
    tab.page.select_option("#run-filters select[name=sort]", "metric:score")
    tab.page.select_option("#run-filters select[name=order]", "asc")
    tab.page.click("#run-filters button")
    tab.page.wait_for_url("**sort=metric%3Ascore**")
    ranked = tab.page.locator(runs).all_inner_texts()
    assert ranked[:3] == ["r00", "r04", "r08"]  # score 0, 1, 2
    assert len(ranked) == 50 and ranked[-1] == "r01"  # 49 with a score, then the first without
    tab.page.click("#next-page")
    tab.page.wait_for_url("**page=2")
    assert tab.page.locator(runs).all_inner_texts() == ["r26"]  # the other one, still last
    tab.goto(f"{ui}/experiments/many")
    tab.page.click("#runs th a[data-sort='metric:score']")  # the column's header: descending
    tab.page.wait_for_url("**sort=metric%3Ascore**")
    ranked = tab.page.locator(runs).all_inner_texts()
    assert ranked[:2] == ["r47", "r43"]  # score 50, 49
    assert ranked[-1] == "r01" and "r26" not in ranked  # without a score: last, either way
    tab.page.click("#runs th a[data-sort='metric:score']")  # again: ascending
    tab.page.wait_for_url("**order=asc**")
    assert tab.page.locator(runs).first.inner_text() == "r00"
    tab.clean()


def test_jobs_sort_by_each_column_both_ways_page_on_and_filter_by_tag(ui, session, tab):
    # a second store on the console's database, with a clock of the test's: real
    # transitions, each job created a second after the last and running 53 - i seconds
    from shoal.storage.sql import SqlMetadataStore

    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    store = SqlMetadataStore.open(f"sqlite:///{session.home / 'shoal.db'}", clock=clock)
    made = []
    for i in range(53):
        name = f"job-{(i * 17) % 53:02d}"  # names not in creation order
        clock.advance()
        store.create_job(JobSpec(name=name, tags=(("team", "red" if i % 3 == 0 else "blue"),
                                                  ("idx", str(i)))),
                         key_salt="s", backend="local")
        store.update_job(name, status=JobStatus.STARTING)
        store.update_job(name, status=JobStatus.RUNNING)
        clock.advance(53 - i)
        store.update_job(name, status=JobStatus.FAILED if i % 5 == 0 else JobStatus.COMPLETED)
        clock.advance(-(53 - i))
        made.append(name)
    store.close()
    names = "#jobs tbody tr td:first-child"

    def shown_in_two_pages() -> list[str]:
        first = tab.page.locator(names).all_inner_texts()
        tab.page.click("#next-page")
        tab.page.wait_for_url("**after=**")
        return first + tab.page.locator(names).all_inner_texts()

    tab.goto(f"{ui}/jobs")
    assert tab.page.locator(names).all_inner_texts() == list(reversed(made))[:50]  # newest
    tab.page.click("#jobs th a[data-sort=name]")  # A-Z first
    tab.page.wait_for_url("**sort=name&order=asc**")
    assert tab.page.get_attribute("#jobs th.sorted", "aria-sort") == "ascending"
    assert shown_in_two_pages() == sorted(made)  # keyset pages: no gap, no repeat
    tab.goto(f"{ui}/jobs?sort=name&order=asc")
    tab.page.click("#jobs th a[data-sort=name]")  # a second click: Z-A
    tab.page.wait_for_url("**sort=name")
    assert shown_in_two_pages() == sorted(made, reverse=True)

    tab.goto(f"{ui}/jobs")
    tab.page.click("#jobs th a[data-sort=duration]")  # the longest first
    tab.page.wait_for_url("**sort=duration")
    assert shown_in_two_pages() == made  # made[i] ran 53 - i seconds
    tab.goto(f"{ui}/jobs?sort=duration")
    tab.page.click("#jobs th a[data-sort=duration]")
    tab.page.wait_for_url("**sort=duration&order=asc")
    assert shown_in_two_pages() == list(reversed(made))

    tab.goto(f"{ui}/jobs")
    tab.page.click("#jobs th a[data-sort=status]")  # completed before failed, then by age
    tab.page.wait_for_url("**sort=status&order=asc")
    assert shown_in_two_pages() == [n for i, n in enumerate(made) if i % 5] + \
        [n for i, n in enumerate(made) if i % 5 == 0]

    tab.goto(f"{ui}/jobs?sort=name&order=asc")
    tab.page.fill("input[name=tag]", "team=red")  # the filter keeps the order
    tab.page.click("#job-filters button")
    tab.page.wait_for_url("**tag=team%3Dred**")
    red = sorted(n for i, n in enumerate(made) if i % 3 == 0)
    assert tab.page.locator(names).all_inner_texts() == red
    assert tab.page.locator("#next-page").count() == 0
    assert "team=red" in tab.page.inner_text("#jobs tbody tr:first-child td.tags")
    tab.page.fill("input[name=tag]", "team=red, idx=3")  # every pair must match
    tab.page.click("#job-filters button")
    tab.page.wait_for_url("**idx**")
    assert tab.page.locator(names).all_inner_texts() == [made[3]]
    tab.clean()
    tab.goto(f"{ui}/jobs?tag=team")
    assert "must be key=value" in tab.page.inner_text("#error-message")


def _add(a: int, b: int) -> int:
    return a + b


def test_a_jobs_page_shows_its_resolved_configuration_with_sources(ui, clean_env, tab,
                                                                    tmp_path, monkeypatch):
    config = tmp_path / "user-config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                      "      RemoteFunction:\n        InstanceType: ml.m5.large\n"
                      "        EnvironmentVariables: {DB_PASSWORD: hunter2-secret, MODE: fast}\n"
                      "        Tags:\n          - {Key: team, Value: vision}\n")
    monkeypatch.setenv("SHOAL_USER_CONFIG_OVERRIDE", str(config))
    with cli_test_session(clean_env) as session:
        executor = RemoteExecutor(sagemaker_session=session, max_retry_attempts=2,
                                  tags=[{"Key": "run", "Value": "7"}])
        future = executor.submit(_add, 1, 2)
        assert future.result(timeout=WAIT * 4) == 3
        name = future.job_name
        executor.shutdown()
        session.metadata.create_job(JobSpec(name="recorded-before"), key_salt="s",
                                    backend="local")  # a spec with no sources, as older ones
        session.metadata.update_job("recorded-before", status=JobStatus.STOPPED)

    tab.goto(f"{ui}/jobs/{name}")
    def row(option: str) -> list[str]:
        return tab.page.locator(f"#config tr[data-option={option}] td").all_inner_texts()

    assert row("instance_type")[1].startswith("ml.m5.large")
    assert row("instance_type")[2] == f"user file {config}"
    assert row("environment_variables")[1:] == ["DB_PASSWORD=****, MODE=fast",
                                                 f"user file {config}"]
    assert row("tags")[1:] == ["run=7, team=vision", f"explicit argument, then user file {config}"]
    assert row("max_retry_attempts")[1:] == ["2", "explicit argument"]
    assert row("max_runtime_in_seconds")[1:] == ["86400", "default"]
    assert "hunter2-secret" not in tab.page.content()
    tab.clean()
    tab.goto(f"{ui}/jobs/recorded-before")
    sources = tab.page.locator("#config td.source").all_inner_texts()
    assert sources and set(sources) == {"not recorded"}
    tab.clean()


def _print_then_wait(go: str, release: str) -> str:
    """Job body: print, wait for *go*, print the marked line, wait for *release*."""
    import time

    def wait_for(path: str) -> None:
        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} never appeared")
            time.sleep(0.01)  # inside the job: bounded poll for the test's signal

    print("started", flush=True)
    wait_for(go)
    print("the marked <b>line</b>", flush=True)
    wait_for(release)
    return "done"


def test_the_log_tail_shows_a_running_jobs_new_line_and_the_status_follows(ui, session, tab,
                                                                            tmp_path):
    go, release = tmp_path / "go", tmp_path / "release"
    executor = RemoteExecutor(sagemaker_session=session)
    future = executor.submit(_print_then_wait, str(go), str(release))
    name = wait_until(lambda: future.job_name, WAIT, what="the job to be submitted")
    wait_until(lambda: b"started" in session.jobs.read_log(name), WAIT * 2,
               what=f"job {name} to print")

    tab.goto(f"{ui}/jobs/{name}")
    tab.page.wait_for_function(
        "() => document.querySelector('#log').textContent.includes('started')")
    go.touch()
    tab.page.wait_for_function(
        "() => document.querySelector('#log').textContent.includes('the marked <b>line</b>')")
    assert session.jobs.get(name).status == JobStatus.RUNNING  # seen while it runs
    assert tab.page.locator("#log b").count() == 0  # the log is text, never HTML
    assert tab.page.inner_text("#job-status .status") == "running"
    tab.page.fill("#log-search", "marked")
    assert tab.page.inner_text("#log-search-count") == "1 line"
    assert tab.page.inner_text("#log-matches") == "the marked <b>line</b>"
    release.touch()
    assert future.result(timeout=WAIT * 2) == "done"
    tab.page.wait_for_function(
        "() => document.querySelector('#job-status .status').textContent === 'completed'")
    tab.clean()
    tab.goto(f"{ui}/jobs/{name}")  # the files it left, each a download
    link = tab.page.locator("#files a", has_text="logs/output.log")
    got = tab.page.request.get(ui + link.get_attribute("href"))
    assert got.ok and got.body() == session.jobs.read_log(name)
    tab.clean()
    executor.shutdown()


# --- the console in shoal server: login, CSRF, owners -------------------------------------

@dataclass(frozen=True)
class Team:
    url: str
    env: dict[str, str]
    admin_token: str = ""

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``shoal ARGS`` on the server's host (its home)."""
        return subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)


def _token(server: Team, user: str) -> str:
    made = server.cli("tokens", "create", "--user", user, "--name", f"{user}-console",
                      "--scope", "write", "--create-user")
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


@pytest.fixture
def team(tmp_path_factory: pytest.TempPathFactory, own_shoal_server: Any) -> Team:
    """A ``shoal server`` of the test's own (tokens on), its first admin made."""
    home = tmp_path_factory.mktemp("console-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg-config"),
               OMP_NUM_THREADS="1")
    init = Team("", env).cli("server", "init")
    assert init.returncode == 0, init.stderr
    _, url, _ = own_shoal_server(home=home)
    return Team(url, env, init.stdout.strip())


def _sign_in(tab: Tab, url: str, token: str, then: str) -> None:
    tab.goto(f"{url}{then}")
    assert "/console/login?next=" in tab.page.url  # not signed in: sent to the login page
    tab.page.fill("input[name=token]", token)
    tab.page.click("form.login button")
    tab.page.wait_for_url(f"{url}{then}")


def test_server_console_signs_in_with_a_token_and_only_the_owner_cancels(
        team, browser, monkeypatch):
    ann, bob = _token(team, "ann"), _token(team, "bob")
    monkeypatch.setenv("SHOAL_SERVER_URL", team.url)
    monkeypatch.setenv("SHOAL_TOKEN", ann)
    as_ann = shoal.Session()
    as_ann.jobs.metadata.create_job(JobSpec(name="anns-job"), key_salt="s", backend="local")
    page_path = "/console/jobs/anns-job"

    def new_tab() -> Tab:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(WAIT * 1000)
        found = Tab(page)
        page.on("console", lambda m: found.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: found.errors.append(str(e)))
        return found

    wrong = new_tab()
    wrong.goto(f"{team.url}/console/jobs")
    wrong.page.fill("input[name=token]", "shoal_not-a-real-token")
    wrong.page.click("form.login button")
    wrong.page.wait_for_selector("#login-error")
    assert "not known" in wrong.page.inner_text("#login-error")

    bobs = new_tab()
    _sign_in(bobs, team.url, bob, page_path)
    cookie = next(c for c in bobs.page.context.cookies() if c["name"] == "shoal_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert bobs.page.locator("#cancel").count() == 0
    assert "Only its owner (ann)" in bobs.page.inner_text("#cancel-note")
    csrf = bobs.page.get_attribute("body", "hx-headers").split('"')[3]
    refused = bobs.page.request.post(f"{team.url}{page_path}/cancel",
                                     form={"csrf": csrf}, max_redirects=0)
    assert refused.status == 403 and "belongs to &#39;ann&#39;" in refused.text()
    forged = bobs.page.request.post(f"{team.url}{page_path}/cancel", form={},
                                    max_redirects=0)
    assert forged.status == 403 and "CSRF" in forged.text()
    assert as_ann.jobs.metadata.get_job("anns-job").status == JobStatus.PENDING
    bobs.clean()
    users = bobs.page.request.get(f"{team.url}/console/users")
    assert users.status == 403 and "only an admin may" in users.text()

    admins = new_tab()
    _sign_in(admins, team.url, team.admin_token, "/console/users")
    listed = admins.page.inner_text("#users")
    assert "ann-console" in listed and "bob-console" in listed and "write" in listed
    assert ann not in admins.page.content() and bob not in admins.page.content()
    admins.clean()

    anns = new_tab()
    _sign_in(anns, team.url, ann, page_path)
    anns.page.click("#cancel")
    anns.page.wait_for_function(
        "() => ['stopping', 'stopped'].includes(document.querySelector('#job-status .status')"
        ".textContent)")
    assert as_ann.jobs.metadata.get_job("anns-job").status in (JobStatus.STOPPING,
                                                               JobStatus.STOPPED)
    anns.clean()
    as_ann.close()
    for t in (wrong, bobs, admins, anns):
        t.page.context.close()


def _new_tab(browser: Any) -> Tab:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT * 1000)
    found = Tab(page)
    page.on("console", lambda m: found.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: found.errors.append(str(e)))
    return found


def _csrf(tab: Tab) -> str:
    return str(tab.page.get_attribute("body", "hx-headers")).split('"')[3]


def test_an_admin_makes_a_token_shown_once_and_revokes_it_others_are_refused(team, browser):
    ann = _token(team, "ann")
    admins = _new_tab(browser)
    _sign_in(admins, team.url, team.admin_token, "/console/users")
    admins.page.fill("#token-form input[name=user]", "carol")
    admins.page.check("#token-form input[name=create_user]")
    admins.page.fill("#token-form input[name=name]", "carol-laptop")
    admins.page.select_option("#token-form select[name=scope]", "read")
    admins.page.fill("#token-form input[name=expires_days]", "7")
    admins.page.click("#token-form button")
    admins.page.wait_for_selector("#new-token-value")
    made = admins.page.inner_text("#new-token-value").strip()
    assert made.startswith("shoal_") and len(made) > 40
    row = admins.page.locator("#users .token", has_text="carol-laptop")
    assert "read" in row.inner_text() and "usable" in row.inner_text()
    assert "expires" in row.inner_text()
    admins.goto(f"{team.url}/console/users")  # never shown again
    assert made not in admins.page.content()
    assert admins.page.locator("#new-token").count() == 0
    admins.clean()

    carols = _new_tab(browser)  # the new token signs in
    _sign_in(carols, team.url, made, "/console/jobs")
    assert "carol" in carols.page.inner_text("header .who")
    carols.clean()

    row = admins.page.locator("#users .token", has_text="carol-laptop")
    with admins.page.expect_navigation():
        row.locator("form.revoke button").click()
    assert admins.page.url == f"{team.url}/console/users"
    row = admins.page.locator("#users .token", has_text="carol-laptop")
    assert row.locator(".state").inner_text() == "revoked"
    assert row.locator("form.revoke").count() == 0
    carols.goto(f"{team.url}/console/jobs")  # the revoked token's session has ended
    assert "/console/login?next=" in carols.page.url
    admins.clean()

    # refusals: without the CSRF token; a user who is not an admin; an admin signed in
    # with a token below admin scope
    forged = admins.page.request.post(f"{team.url}/console/users/tokens", form={
        "user": "ann", "name": "forged", "scope": "admin"}, max_redirects=0)
    assert forged.status == 403 and "CSRF" in forged.text()
    anns = _new_tab(browser)
    _sign_in(anns, team.url, ann, "/console/jobs")
    refused = anns.page.request.post(f"{team.url}/console/users/tokens", form={
        "csrf": _csrf(anns), "user": "ann", "name": "ann-made", "scope": "admin"},
        max_redirects=0)
    assert refused.status == 403 and "only an admin may" in refused.text()
    revoking = anns.page.request.post(
        f"{team.url}/console/users/tokens/whatever/revoke", form={"csrf": _csrf(anns)},
        max_redirects=0)
    assert revoking.status == 403
    weak = team.cli("tokens", "create", "--user", "admin", "--name", "admin-write",
                    "--scope", "write")
    assert weak.returncode == 0, weak.stderr
    writes = _new_tab(browser)
    _sign_in(writes, team.url, weak.stdout.strip(), "/console/users")  # may look
    below = writes.page.request.post(f"{team.url}/console/users/tokens", form={
        "csrf": _csrf(writes), "user": "ann", "name": "ann-made", "scope": "read"},
        max_redirects=0)
    assert below.status == 403 and "sign in with an admin token" in below.text()
    admins.goto(f"{team.url}/console/users")
    assert "ann-made" not in admins.page.inner_text("#users")
    assert "forged" not in admins.page.inner_text("#users")
    for t in (admins, carols, anns, writes):
        t.page.context.close()
