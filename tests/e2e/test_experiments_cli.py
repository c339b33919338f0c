"""``shoal experiments``, ``shoal runs show`` and ``shoal jobs metrics`` end to end: runs
recorded by real code (and a real job), read back by the ``shoal`` command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal
from shoal import remote
from shoal.core import MetricPoint, job_owner
from shoal.experiments import Run

CLI = [sys.executable, "-m", "shoal.cli"]
BRAILLE = range(0x2800, 0x2900)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ), stdin=subprocess.DEVNULL)


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], proc.stderr


def has_plot(text: str, *, points: int = 10) -> bool:
    """A framed plot with at least *points* plotted characters (braille, or dots)."""
    framed = all(ch in text for ch in "┌┐└┘┤")
    return framed and sum(1 for ch in text if ord(ch) in BRAILLE or ch == "•") >= points


@pytest.fixture
def session(clean_env: Path) -> Iterator[shoal.Session]:
    s = shoal.Session(home=str(clean_env), launcher_idle_seconds=60)
    with shoal.use(s):
        yield s
    if s._backend is not None:
        s.backend.shutdown_launcher()
    s.close()


def _job() -> int:
    return 42


@pytest.fixture
def recorded(session: shoal.Session) -> str:
    """Experiment 'cli-exp': run 'fast' (lr 0.1, loss falls to 0.1, one linked job) and run
    'slow' (lr 0.01, loss falls to 0.5). Returns the job's name."""
    with Run(experiment_name="cli-exp", run_name="fast", run_display_name="Fast one",
             tags={"team": "ml"}) as run:
        run.log_parameters({"lr": 0.1, "optimizer": "adam"})
        for step in range(50):
            run.log_metric("loss", 1.0 - step * 0.9 / 49, step=step)
        run.log_metric("acc", 0.9)
        run.log_artifact("dataset", "s3://bucket/train.csv", is_output=False)
        run.log_confusion_matrix([0, 1, 1], [0, 1, 0], title="confusion")
        assert remote(_job)() == 42
    with Run(experiment_name="cli-exp", run_name="slow") as run:
        run.log_parameters({"lr": 0.01, "optimizer": "sgd"})
        for step in range(20):
            run.log_metric("loss", 1.0 - step * 0.5 / 19, step=step)
    [job] = session.metadata.get_run("cli-exp", "fast").jobs
    return job


def test_experiments_list(recorded):
    proc = run_cli("experiments", "list")
    assert proc.returncode == 0, proc.stderr
    [header, row] = proc.stdout.splitlines()
    assert header.split()[:3] == ["EXPERIMENT", "DISPLAY", "NAME"]
    assert row.split()[:3] == ["cli-exp", "-", "2"]


def test_experiment_runs_table_sorted_by_a_metric(recorded):
    proc = run_cli("experiments", "runs", "cli-exp", "--sort", "loss")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["RUN", "STATUS", "CREATED", "PARAMETERS", "acc", "loss"]
    assert [line.split()[0] for line in lines[1:]] == ["fast", "slow"]  # lowest last loss first
    assert "lr=0.1, optimizer=adam" in lines[1] and lines[1].split()[-1] == "0.1"
    assert "Completed" in lines[1] and lines[2].split()[-2:] == ["-", "0.5"]
    desc = run_cli("experiments", "runs", "cli-exp", "--sort", "loss", "--desc")
    assert [line.split()[0] for line in desc.stdout.splitlines()[1:]] == ["slow", "fast"]
    by_param = run_cli("experiments", "runs", "cli-exp", "--sort", "lr")
    assert [line.split()[0] for line in by_param.stdout.splitlines()[1:]] == ["slow", "fast"]
    one_line_error(run_cli("experiments", "runs", "cli-exp", "--sort", "nope"), 2, "'nope'",
                   "loss", "lr")


def test_runs_show_everything_and_a_plot(recorded):
    proc = run_cli("runs", "show", "fast")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("cli-exp", "Fast one", "Completed", "lr", "0.1", "optimizer", "adam",
                   "team", "ml", "dataset", "input", "s3://bucket/train.csv", "confusion",
                   "ConfusionMatrix", "experiments/cli-exp/fast/confusion.json", recorded,
                   f"shoal jobs describe {recorded}", "METRIC", "COUNT"):
        assert needle in out, needle
    [loss_row] = [line for line in out.splitlines() if line.startswith("loss ")]
    assert loss_row.split() == ["loss", "50", "0.1", "1", "0.55", "0.1"]
    assert has_plot(out, points=1)
    plot = out.rstrip().split("\n\n")[-1]
    assert plot.splitlines()[0].strip() == "acc"  # the first metric by name, by default
    chosen = run_cli("runs", "show", "fast", "--experiment", "cli-exp", "--metric", "loss")
    assert chosen.returncode == 0 and has_plot(chosen.stdout) and "step" in chosen.stdout


def test_runs_show_errors_name_what_is_missing(recorded):
    one_line_error(run_cli("runs", "show", "ghost"), 3, "'ghost'")
    one_line_error(run_cli("runs", "show", "fast", "--experiment", "nope-exp"), 3, "'fast'",
                   "'nope-exp'")
    one_line_error(run_cli("experiments", "runs", "nope-exp"), 3, "'nope-exp'")
    one_line_error(run_cli("runs", "show", "fast", "--metric", "f1"), 2, "'f1'", "acc, loss")


def test_jobs_metrics_and_describe(session, recorded):
    # Job metrics come from the job's output (training jobs); written here through the port.
    now = time.time()
    session.metadata.add_metrics(job_owner(recorded), [
        MetricPoint("train:loss", 2.0 - i * 0.1, now + i, i) for i in range(15)])
    proc = run_cli("jobs", "metrics", recorded)
    assert proc.returncode == 0, proc.stderr
    [row] = [line for line in proc.stdout.splitlines() if line.startswith("train:loss")]
    assert row.split() == ["train:loss", "15", "0.6", "2", "1.3", "0.6"]
    assert has_plot(proc.stdout)
    one_line_error(run_cli("jobs", "metrics", recorded, "--metric", "acc"), 2, "'acc'",
                   "train:loss")
    one_line_error(run_cli("jobs", "metrics", "no-such-job"), 3, "no-such-job")

    described = run_cli("jobs", "describe", recorded)
    assert described.returncode == 0, described.stderr
    text = described.stdout
    assert "Metrics" in text and "train:loss" in text and "15 points, last 0.6" in text
    assert "cli-exp/fast" in text and "shoal runs show fast --experiment cli-exp" in text
    data = json.loads(run_cli("jobs", "describe", recorded, "--json").stdout)
    assert data["runs"] == [{"experiment_name": "cli-exp", "run_name": "fast"}]
    assert [(m["name"], m["count"], m["last"]) for m in data["metrics"]] == [
        ("train:loss", 15, pytest.approx(0.6))]


def test_a_job_without_metrics(session):
    name = remote(_job_name)()
    proc = run_cli("jobs", "metrics", name)
    assert proc.returncode == 0 and proc.stdout == "" and f"job {name} has no metrics" in \
        proc.stderr
    described = run_cli("jobs", "describe", name)
    assert described.returncode == 0 and "Metrics" not in described.stdout


def _job_name() -> str:
    return os.environ["SHOAL_JOB_NAME"]


def test_no_experiments_yet(clean_env):
    proc = run_cli("experiments", "list")
    assert proc.returncode == 0 and proc.stdout == "" and "no experiments yet" in proc.stderr
