"""Screenshots of every page of the web console into docs/console/ (the README shows them).

Seeds a throwaway SHOAL_HOME with jobs (tags, sources of their options), a log, an
experiment of runs with metrics and an endpoint whose one instance is a small HTTP server
here answering ``/metrics`` as a model server does (shoal's ``ServerMetrics``, fed by
requests this script sends while the endpoint's page is open), starts ``shoal ui`` on a free
loopback port and photographs each page in headless Chromium (Debian's,
``scripts/chromium.sh``; Playwright's Python package drives it). Then a throwaway ``shoal
server`` (tokens on) for the login page and the users page, where its admin has just made a
token (shown that once). Rerun after changing a page:

    PYTHONPATH=src .venv/bin/python scripts/console_screenshots.py
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "docs" / "console"


def _seed(home: Path, port: int) -> str:
    os.environ["SHOAL_HOME"] = str(home)
    from shoal.core import JobQuery
    from shoal.core.experiments import MetricPoint, run_owner
    from shoal.core.jobs import JobSpec, JobStatus
    from shoal.jobs import log_key
    from shoal.session import Session

    session = Session()
    runs = session.runs
    session.metadata.list_jobs(JobQuery(limit=1))  # the database, made
    # the jobs written with a clock of the script's: ages and durations as a day of work
    from shoal.storage.sql import SqlMetadataStore

    clock = _Clock(datetime.now(UTC) - timedelta(hours=26))
    store = SqlMetadataStore.open(f"sqlite:///{home / 'shoal.db'}", clock=clock)
    statuses = [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.COMPLETED, JobStatus.STOPPED]
    for i in range(24):
        name = f"train-resnet-{i:02d}"
        store.create_job(JobSpec(
            name=name, instance_type="ml.g5.xlarge", cpus=4.0, gpus=1, memory_mib=16384,
            environment_variables={"WANDB_API_KEY": "not-shown", "EPOCHS": "10"},
            tags=(("team", "vision" if i % 2 else "search"), ("sweep", f"s{i // 6}")),
            max_retry_attempts=2, option_sources={
                "*": "default", "instance_type": "user file ~/.config/sagemaker/config.yaml",
                "environment_variables": "admin file /etc/xdg/sagemaker/config.yaml",
                "tags": "explicit argument, then user file ~/.config/sagemaker/config.yaml",
                "max_retry_attempts": "explicit argument"}),
            key_salt="s", backend="local", owner="ann" if i % 3 else "bob")
        clock.at += timedelta(seconds=20 + i % 4 * 9)
        store.update_job(name, status=JobStatus.STARTING)
        store.update_job(name, status=JobStatus.RUNNING)
        ran = timedelta(minutes=3 + (i * 37) % 41, seconds=i * 7 % 60)
        clock.at += ran
        if i < 20:
            status = statuses[i % len(statuses)]
            if status == JobStatus.STOPPED:
                store.update_job(name, status=JobStatus.STOPPING, reason="stop requested")
            store.update_job(name, status=status,
                             reason="CUDA out of memory" if status == JobStatus.FAILED else None)
        clock.at += timedelta(minutes=62) - ran
    shown = "train-resnet-22"
    session.artifacts.put_bytes(log_key(shown), "".join(
        f"epoch {e:2d}  loss {1 / (e + 1):.4f}  acc {1 - 0.5 / (e + 1):.4f}\n"
        for e in range(30)).encode())
    runs.ensure_experiment("resnet-sweep")
    start = datetime(2026, 1, 5, tzinfo=UTC).timestamp()
    for i, lr in enumerate((0.1, 0.03, 0.01, 0.003, 0.001)):
        run = f"lr-{lr}"
        runs.create_run("resnet-sweep", run)
        runs.set_run_parameters("resnet-sweep", run, {"lr": lr, "batch_size": 128,
                                                      "optimizer": "adamw"})
        runs.add_metrics(run_owner("resnet-sweep", run), [
            MetricPoint("loss", 2.5 * math.exp(-step * lr / 50) + 0.05 * math.sin(step / 40)
                        + (0.8 if step == 3333 + i * 100 else 0.0),
                        start + step + (timedelta(hours=i).total_seconds()), step)
            for step in range(10_000)])
        runs.add_metrics(run_owner("resnet-sweep", run), [
            MetricPoint("accuracy", 1 - math.exp(-step * lr / 40), start + step, step)
            for step in range(0, 10_000, 10)])
    from shoal.core.endpoints import (
        EndpointConfig,
        EndpointInstance,
        EndpointStatus,
        InstanceStatus,
    )

    store.create_endpoint("resnet-serving", model_data="file:///models/resnet/model.tar.gz",
                          config=EndpointConfig(instance_type="ml.g5.xlarge", instance_count=2),
                          owner="ann")
    store.put_endpoint_instance("resnet-serving", EndpointInstance(
        0, "127.0.0.1", port, status=InstanceStatus.IN_SERVICE))
    store.update_endpoint("resnet-serving", status=EndpointStatus.IN_SERVICE)
    store.create_endpoint("bert-search", model_data="file:///models/bert/model.tar.gz",
                          config=EndpointConfig(instance_count=1), owner="bob")
    store.close()
    session.close()
    return shown


class _Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


class _Instance:
    """A model server's ``/metrics`` on loopback (``ServerMetrics``), and requests to it."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from shoal.serving.metrics import ServerMetrics

        metrics = ServerMetrics(queue_depth=lambda: 1.0, loaded=lambda: 1.0)
        self.metrics = metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = metrics.render()
                self.send_response(200)
                self.send_header("Content-Type", ServerMetrics.content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.stop = threading.Event()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._traffic, daemon=True).start()

    def _traffic(self) -> None:
        """Requests as a busy endpoint gets them: a rate and a latency that wander."""
        step = 0
        while not self.stop.wait(0.05):
            step += 1
            for _ in range(1 + int(3 + 3 * math.sin(step / 15))):
                self.metrics.request(200 if step % 50 else 500,
                                     0.012 + 0.006 * math.sin(step / 9) ** 2)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/static/console.css", timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.2)  # a script, not a test: waiting for the server to start


def _shoot(page: Any, name: str) -> None:
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=False)
    print(f"docs/console/{name}.png")  # noqa: T201 - a script


def _server_pages(browser: Any, tmp: Path) -> None:
    """The login page and the users page of a ``shoal server`` with tokens on."""
    home = tmp / "server"
    home.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=env,
                              capture_output=True, text=True, timeout=300, check=True)
        return done.stdout.strip()

    admin = cli("server", "init")
    for user, scope in (("ann", "write"), ("bob", "read")):
        cli("tokens", "create", "--user", user, "--name", f"{user}-laptop", "--scope", scope,
            "--create-user")
    cli("tokens", "create", "--user", "ann", "--name", "ann-ci", "--scope", "write")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "server", "--port", str(port)],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/console"
    try:
        _wait_up(url, proc)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{url}/users")
        page.wait_for_selector("form.login")
        _shoot(page, "login")
        page.fill("input[name=token]", admin)
        page.click("form.login button")
        page.wait_for_selector("#token-form")
        with page.expect_navigation():
            page.locator("#users .token", has_text="ann-ci").locator("button").click()
        page.fill("#token-form input[name=user]", "carol")
        page.check("#token-form input[name=create_user]")
        page.fill("#token-form input[name=name]", "carol-notebook")
        page.fill("#token-form input[name=expires_days]", "30")
        page.click("#token-form button")
        page.wait_for_selector("#new-token-value")
        _shoot(page, "users")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("SHOAL_TEST_CHROMIUM") or shutil.which("chromium")
    if not chromium:
        sys.exit("no chromium: run scripts/chromium.sh first")
    OUT.mkdir(parents=True, exist_ok=True)
    instance = _Instance()
    with tempfile.TemporaryDirectory(prefix="shoal-shots-") as tmp:
        Path(tmp).chmod(0o700)
        (Path(tmp) / "ui").mkdir(mode=0o700)
        job = _seed(Path(tmp) / "ui", instance.port)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "ui", "--port", str(port)],
                                env=os.environ.copy(), stdin=subprocess.DEVNULL)
        try:
            _wait_up(url, proc)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, headless=True)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                shots = [("jobs", "/jobs", "#jobs"), ("job", f"/jobs/{job}", "#log"),
                         ("experiments", "/experiments", "#experiments"),
                         ("runs", "/experiments/resnet-sweep", "#runs"),
                         ("run", "/experiments/resnet-sweep/runs/lr-0.01",
                          "figure.chart[data-drawn]"),
                         ("compare", "/experiments/resnet-sweep/compare?metric=loss",
                          "figure#compare[data-drawn]"),
                         # the endpoint first: the list then has its rate
                         ("endpoint", "/endpoints/resnet-serving", "#load[data-points]"),
                         ("endpoints", "/endpoints", "#endpoints"),
                         ("environments", "/environments", "main h1")]
                for name, path, ready in shots:
                    page.goto(url + path)
                    page.wait_for_selector(ready)
                    if name == "job":
                        page.wait_for_function(
                            "() => document.querySelector('#log').textContent.length > 0")
                        _shoot(page, name)
                        page.locator("#config").scroll_into_view_if_needed()
                        name = "job-config"
                    if name == "endpoint":  # a minute of traffic on its charts
                        page.wait_for_function("() => Number(document.querySelector('#load')"
                                               ".dataset.points) >= 30", timeout=120_000)
                    _shoot(page, name)
                _server_pages(browser, Path(tmp))
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=15)
            instance.close()


if __name__ == "__main__":
    main()
