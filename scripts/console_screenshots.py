"""Screenshots of the web console's pages into docs/console/ (the README shows them).

Seeds a throwaway SHOAL_HOME with jobs, a log and an experiment of runs with metrics, starts
``shoal ui`` on a free loopback port and photographs each page in headless Chromium (Debian's,
``scripts/chromium.sh``; Playwright's Python package drives it). Rerun after changing a page:

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

OUT = Path(__file__).resolve().parent.parent / "docs" / "console"


def _seed(home: Path) -> str:
    os.environ["SHOAL_HOME"] = str(home)
    from shoal.core.experiments import MetricPoint, run_owner
    from shoal.core.jobs import JobSpec, JobStatus
    from shoal.jobs import log_key
    from shoal.session import Session

    session = Session()
    store, runs = session.metadata, session.runs
    statuses = [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.COMPLETED, JobStatus.STOPPED]
    for i in range(24):
        name = f"train-resnet-{i:02d}"
        store.create_job(JobSpec(name=name, instance_type="ml.g5.xlarge", environment_variables={
            "WANDB_API_KEY": "not-shown", "EPOCHS": "10"}), key_salt="s", backend="local",
            owner="ann" if i % 3 else "bob")
        store.update_job(name, status=JobStatus.STARTING)
        store.update_job(name, status=JobStatus.RUNNING)
        if i < 20:
            status = statuses[i % len(statuses)]
            if status == JobStatus.STOPPED:
                store.update_job(name, status=JobStatus.STOPPING, reason="stop requested")
            store.update_job(name, status=status,
                             reason="CUDA out of memory" if status == JobStatus.FAILED else None)
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
    session.close()
    return shown


def main() -> None:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("SHOAL_TEST_CHROMIUM") or shutil.which("chromium")
    if not chromium:
        sys.exit("no chromium: run scripts/chromium.sh first")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shoal-shots-") as tmp:
        job = _seed(Path(tmp))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "ui", "--port", str(port)],
                                env=os.environ.copy(), stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"{url}/static/console.css", timeout=2)
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.2)  # a script, not a test: waiting for the server to start
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, headless=True)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                shots = [("jobs", "/jobs", "#jobs"), ("job", f"/jobs/{job}", "#log"),
                         ("experiments", "/experiments", "#experiments"),
                         ("runs", "/experiments/resnet-sweep", "#runs"),
                         ("run", "/experiments/resnet-sweep/runs/lr-0.01",
                          "figure.chart[data-drawn]"),
                         ("compare", "/experiments/resnet-sweep/compare?metric=loss",
                          "figure#compare[data-drawn]")]
                for name, path, ready in shots:
                    page.goto(url + path)
                    page.wait_for_selector(ready)
                    if name == "job":
                        page.wait_for_function(
                            "() => document.querySelector('#log').textContent.length > 0")
                    page.screenshot(path=str(OUT / f"{name}.png"), full_page=False)
                    print(f"docs/console/{name}.png")  # noqa: T201 - a script
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=15)


if __name__ == "__main__":
    main()
