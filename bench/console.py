"""The web console against MLflow's UI (issue #21): time to first paint of the runs page and
to a drawn 20-run comparison chart, in the same headless Chromium, same run, same data.

    .venv/bin/python bench/console.py [--runs 1000] [--metrics 5] [--steps 10000]
                                      [--compare 20] [--rounds 3] [--only both|shoal]

The same runs (parameters ``lr``, ``batch``, ``seed``; metrics ``m0``..``m<k>`` of
``--steps`` steps each) go into a ``shoal ui`` home (SQLite, through ``RunStore``, a batch of
all a run's points at a time, in a process of its own) and, at the same time, into an
``mlflow server`` (its defaults, SQLite, in MLflow's own venv under the bench cache: runs and
parameters through its REST API, metric rows written straight into its database, since
logging millions of points over its API takes far longer than the measurement). Each round
opens a fresh browser context (empty cache) per page and reads ``performance.now()`` (ms since
the navigation started) when the page shows what was asked:

- runs page: shoal's ``/experiments/<e>`` shows its first row; MLflow's
  ``#/experiments/<id>/runs`` shows the newest run's name;
- chart: shoal's ``/experiments/<e>/compare?metric=m0&run=...`` has drawn all its series
  (``figure#compare[data-drawn]``; also shown: the figure's own ``data-drawn-ms``, when
  console.js had drawn it); MLflow's metric page
  (``#/metric/?runs=[...]&metric="m0"``, what "compare → a metric" opens) has a Plotly trace per run.

Goal (issue #21): >= 3x faster than MLflow on the runs page, >= 9x on the 20-run chart.
Chromium: ``SHOAL_TEST_CHROMIUM`` or ``chromium`` on PATH (``scripts/chromium.sh``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any
from urllib.parse import quote

from _common import cpu_model, scratch
from _servers import (
    Server,
    _spawn,
    free_port,
    mlflow_python,
    mlflow_version,
    shoal_env,
    start_mlflow,
)

EXPERIMENT = "console-bench"
TIMEOUT_MS = int(os.environ.get("CONSOLE_BENCH_TIMEOUT_MS", "120000"))
T0_MS = 1_750_000_000_000  # the first point's time (ms since the epoch)


def _header(args: argparse.Namespace) -> None:
    print(f"CPU: {cpu_model()}")
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average: {' '.join(load)}   python {sys.version.split()[0]}   "
          f"{args.runs} runs x {args.metrics} metrics x {args.steps} steps, "
          f"{args.compare}-run chart, {args.rounds} rounds")


def _values(run: int, metric: int, steps: int) -> list[float]:
    rng = random.Random(run * 1000 + metric)
    return [1.0 / (1 + s / 100) + rng.random() * 0.05 for s in range(steps)]


def _params(run: int) -> dict[str, Any]:
    return {"lr": round(0.001 * (1 + run % 10), 4), "batch": 32 << (run % 3), "seed": run}


def load_shoal(home: Path, args: argparse.Namespace) -> float:
    import shoal
    from shoal.core import MetricPoint, RunStatus, run_owner

    t0 = time.perf_counter()
    session = shoal.Session(home=str(home))
    try:
        store = session.runs
        store.ensure_experiment(EXPERIMENT)
        for r in range(args.runs):
            name = f"run-{r:04d}"
            store.create_run(EXPERIMENT, name)
            store.set_run_parameters(EXPERIMENT, name, _params(r))
            points = [MetricPoint(f"m{m}", v, (T0_MS + s * 1000) / 1000, s)
                      for m in range(args.metrics)
                      for s, v in enumerate(_values(r, m, args.steps))]
            # One batch (one transaction) per run, at most 100,000 points.
            for i in range(0, len(points), 100_000):
                store.add_metrics(run_owner(EXPERIMENT, name), points[i:i + 100_000])
            store.end_run(EXPERIMENT, name, status=RunStatus.COMPLETED)
    finally:
        session.close()
    return time.perf_counter() - t0


def _mlflow_call(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/{path}", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    for attempt in range(5):  # its workers start after /health answers: a dropped connection
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return dict(json.loads(answer.read() or b"{}"))
        except (ConnectionError, http.client.RemoteDisconnected):
            if attempt == 4:
                raise
            time.sleep(1)  # a bounded retry of a server this bench started
    raise AssertionError("unreachable")


def load_mlflow(url: str, db: Path, args: argparse.Namespace) -> tuple[float, str, list[str]]:
    """Runs and parameters through the REST API; metric rows straight into its tables."""
    t0 = time.perf_counter()
    experiment = _mlflow_call(url, "experiments/create", {"name": EXPERIMENT, "tags": [
        {"key": "mlflow.experimentKind", "value": "custom_model_development"}]}
    )["experiment_id"]

    def create(r: int) -> str:
        run = _mlflow_call(url, "runs/create", {
            "experiment_id": experiment, "run_name": f"run-{r:04d}",
            "start_time": T0_MS + r})["run"]["info"]["run_id"]
        _mlflow_call(url, "runs/log-batch", {"run_id": run, "params": [
            {"key": k, "value": str(v)} for k, v in _params(r).items()]})
        return str(run)

    with ThreadPoolExecutor(max_workers=8) as pool:  # its server has several workers
        ids = list(pool.map(create, range(args.runs)))
    with sqlite3.connect(db, timeout=60) as conn:
        # Loading only (the server reads it after): no fsync, and a 2 GB page cache, since
        # its primary key index takes each run's rows all over its B-tree.
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA cache_size = -2000000")
        for r, run in enumerate(ids):
            rows = []
            latest = []
            for m in range(args.metrics):
                values = _values(r, m, args.steps)
                rows += [(f"m{m}", v, T0_MS + s * 1000, run, s, 0)
                         for s, v in enumerate(values)]
                latest.append((f"m{m}", values[-1], T0_MS + (args.steps - 1) * 1000,
                               args.steps - 1, 0, run))
            conn.executemany("INSERT INTO metrics (key, value, timestamp, run_uuid, step, "
                             "is_nan) VALUES (?, ?, ?, ?, ?, ?)", rows)
            conn.executemany("INSERT INTO latest_metrics (key, value, timestamp, step, "
                             "is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)", latest)
        conn.execute("UPDATE runs SET status = 'FINISHED', end_time = start_time + 1000 "
                     "WHERE experiment_id = ?", (experiment,))
    return time.perf_counter() - t0, str(experiment), ids


def start_ui(home: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "shoal.cli", "ui", "--port", str(port)]
    return _spawn("shoal ui", argv, env=shoal_env(home), cwd=home, log=home / f"ui-{port}.log",
                  probe="/experiments", port=port)


def _painted(browser: Any, url: str, ready: Callable[[Any], None],
             drawn_at: str | None = None) -> tuple[float, float | None]:
    """Seconds from the navigation's start to *ready* returning, in a fresh context; and,
    with *drawn_at* (a CSS selector), the figure's own ``data-drawn-ms`` (when console.js
    had drawn it, without Playwright's noticing)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url, wait_until="commit")
        try:
            ready(page)
        except Exception as e:
            # Recorded as never shown (inf), so the other pages are still measured: loading
            # the full size takes longer than any measurement.
            shot = Path(scratch()) / "console-bench-failed.png"
            page.screenshot(path=str(shot))
            print(f"{url[:120]}: not shown within {TIMEOUT_MS / 1000:.0f} s "
                  f"({type(e).__name__}); screenshot {shot}", file=sys.stderr, flush=True)
            return math.inf, None
        noticed = float(page.evaluate("performance.now()")) / 1000
        drawn = page.get_attribute(drawn_at, "data-drawn-ms") if drawn_at else None
        return noticed, None if drawn is None else float(drawn) / 1000
    finally:
        context.close()


def _pages(ui: Server, mlflow: tuple[Server, str, list[str]] | None,
           args: argparse.Namespace) -> dict[str, tuple[str, Callable[[Any], None], str | None]]:
    shown = [f"run-{r:04d}" for r in range(args.runs - args.compare, args.runs)]
    pages: dict[str, tuple[str, Callable[[Any], None], str | None]] = {
        "shoal runs": (f"{ui.url}/experiments/{EXPERIMENT}",
                       lambda p: p.wait_for_selector("input[name=run]"), None),
        "shoal chart": (
            f"{ui.url}/experiments/{EXPERIMENT}/compare?metric=m0&"
            + "&".join(f"run={n}" for n in shown),
            lambda p: p.wait_for_selector(f"figure#compare[data-drawn='{args.compare}']"),
            "figure#compare"),
    }
    if mlflow is None:
        return pages
    server, experiment, ids = mlflow
    compared = ids[args.runs - args.compare:]
    pages["mlflow runs"] = (f"{server.url}/#/experiments/{experiment}/runs",
                            lambda p: p.get_by_text(f"run-{args.runs - 1:04d}",
                                                    exact=True).first.wait_for(), None)
    pages["mlflow chart"] = (
        # As MLflow's Routes.getMetricPageRoute builds it.
        f"{server.url}/#/metric/?runs={json.dumps(compared)}&metric="
        f"{quote(json.dumps('m0'))}&experiments={json.dumps([experiment])}&"
        f"plot_metric_keys={quote(json.dumps(['m0']))}&plot_layout={{}}&"
        "x_axis=step&y_axis_scale=linear&line_smoothness=1&show_point=false&"
        "deselected_curves=[]&last_linear_y_axis_range=[]",
        lambda p: p.wait_for_function(
            "n => document.querySelectorAll('.js-plotly-plot .scatterlayer "
            ".trace').length >= n", arg=args.compare, polling=50), None)
    return pages


def _measure(chromium: str, pages: dict[str, tuple[str, Callable[[Any], None], str | None]],
             rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {k: [] for k in pages}
    drawn: dict[str, list[float]] = {k: [] for k, v in pages.items() if v[2]}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True)
        try:
            for page in pages.values():  # a warm-up of each server
                _painted(browser, *page)
            for r in range(rounds):
                order = list(pages) if r % 2 == 0 else list(pages)[::-1]
                for name in order:
                    noticed, at = _painted(browser, *pages[name])
                    print(f"  round {r + 1}: {name} {noticed:.2f} s", flush=True)
                    times[name].append(noticed)
                    if at is not None:
                        drawn[name].append(at)
        finally:
            browser.close()
    return times, drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--metrics", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--compare", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("both", "shoal"), default="both",
                        help="shoal: no MLflow (e.g. 20 runs x 100,000 steps on one chart)")
    args = parser.parse_args()
    if args.compare > args.runs:
        parser.error("--compare cannot exceed --runs")
    chromium = os.environ.get("SHOAL_TEST_CHROMIUM") or shutil.which("chromium")
    if not chromium:
        sys.exit("no Chromium: run scripts/chromium.sh or set SHOAL_TEST_CHROMIUM")
    _header(args)
    python = mlflow_python() if args.only == "both" else None
    if python is not None:
        print(f"anchor: MLflow {mlflow_version(python)} ('mlflow server', SQLite)")
    with tempfile.TemporaryDirectory(prefix="console-", dir=scratch()) as tmp_name:
        tmp = Path(tmp_name)
        shoal_home, mlflow_dir = tmp / "shoal", tmp / "mlflow"
        shoal_home.mkdir(mode=0o700)
        servers: list[Server] = []
        try:
            # Both load at once (two databases, two processes): shoal's in a process of its
            # own while this one feeds MLflow.
            with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
                loading = pool.submit(load_shoal, shoal_home, args)
                mlflow = None
                if python is not None:
                    server = start_mlflow(python, mlflow_dir)
                    servers.append(server)
                    seconds, experiment, ids = load_mlflow(server.url,
                                                           mlflow_dir / "mlflow.db", args)
                    mlflow = (server, experiment, ids)
                    print(f"loaded MLflow in {seconds:.1f} s", flush=True)
                print(f"loaded shoal in {loading.result():.1f} s", flush=True)
            ui = start_ui(shoal_home)
            servers.append(ui)
            print(f"load average before measuring: "
                  f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
            times, drawn = _measure(chromium, _pages(ui, mlflow, args), args.rounds)
            for name, found in times.items():
                print(f"{name:13s} p50 {statistics.median(found):6.2f} s   "
                      f"({', '.join(f'{t:.2f}' for t in found)})")
                if drawn.get(name):
                    print(f"{'':13s} drawn (console.js' own time) p50 "
                          f"{statistics.median(drawn[name]):6.2f} s   "
                          f"({', '.join(f'{t:.2f}' for t in drawn[name])})")
            if mlflow is not None:
                for what, goal in (("runs", 3), ("chart", 9)):
                    ratio = (statistics.median(times[f"mlflow {what}"])
                             / statistics.median(times[f"shoal {what}"]))
                    print(f"ratio mlflow/shoal {what}: {ratio:.1f}x   goal >= {goal}x")
            print(f"load average after: "
                  f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
        finally:
            for server in reversed(servers):
                server.stop()


if __name__ == "__main__":
    main()
