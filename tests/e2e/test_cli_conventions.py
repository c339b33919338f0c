"""CLI conventions (issue #17 item 4): --version, shell completion from the store, --json on
every listing and show command, one table style, ``shoal serve`` = ``python -m
shoal.serving``, ``jobs logs --tail``. Real subprocesses, real SQLite, real jobs."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal
from shoal import remote
from shoal.experiments import Run

CLI = [sys.executable, "-m", "shoal.cli"]
SRC = Path(shoal.__file__).parent


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


@pytest.fixture
def session(clean_env: Path) -> Iterator[shoal.Session]:
    s = shoal.Session(home=str(clean_env), launcher_idle_seconds=60)  # SHOAL_HOME of the CLI
    yield s
    s.backend.shutdown_launcher()
    s.close()


def _five_lines() -> int:
    for i in range(5):
        print(f"line {i}", flush=True)
    return 5


def test_version_names_the_package_version(clean_env: Path) -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"shoal {shoal.__version__} (Python ")


def _complete(*words: str, home: Path) -> list[str]:
    line = " ".join(["shoal", "--home", str(home), *words])
    proc = run_cli(env={"_SHOAL_COMPLETE": "complete_bash", "COMP_WORDS": line,
                        "COMP_CWORD": str(len(words) + 2)})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout.split()


def test_completion_offers_job_experiment_and_run_names(session, tmp_path) -> None:
    remote(sagemaker_session=session, job_name_prefix="alpha")(_five_lines)()
    remote(sagemaker_session=session, job_name_prefix="beta")(_five_lines)()
    with Run(experiment_name="exp-complete", run_name="run-one", sagemaker_session=session):
        pass
    home = session.home
    jobs = _complete("jobs", "describe", "al", home=home)
    assert len(jobs) == 1 and jobs[0].startswith("alpha-")
    assert len(_complete("jobs", "logs", "", home=home)) == 2
    assert _complete("experiments", "runs", "exp-", home=home) == ["exp-complete"]
    assert _complete("runs", "show", "run-", home=home) == ["run-one"]
    assert _complete("endpoints", "describe", "", home=home) == []
    # Silent on errors: a home without a database completes nothing, prints nothing.
    assert _complete("jobs", "describe", "", home=tmp_path / "empty-home") == []
    shown = run_cli("--show-completion", "bash")
    assert shown.returncode == 0 and "_SHOAL_COMPLETE" in shown.stdout


def test_json_on_experiments_runs_metrics_and_envs(session) -> None:
    with Run(experiment_name="exp-json", run_name="r1", sagemaker_session=session) as run:
        run.log_parameter("lr", 0.1)
        for step, value in enumerate((0.9, 0.5, 0.2)):
            run.log_metric("loss", value, step=step)

    experiments = json.loads(run_cli("experiments", "list", "--json").stdout)
    assert [(e["name"], e["run_count"]) for e in experiments] == [("exp-json", 1)]
    [r] = json.loads(run_cli("experiments", "runs", "exp-json", "--json").stdout)
    assert r["run_name"] == "r1" and r["parameters"] == {"lr": 0.1}
    assert r["metrics"] == [{"name": "loss", "count": 3, "min": 0.2, "max": 0.9,
                             "avg": pytest.approx(1.6 / 3), "last": 0.2}]
    shown = json.loads(run_cli("runs", "show", "r1", "--json", "--metric", "loss").stdout)
    assert shown["experiment_name"] == "exp-json" and shown["status"] == "Completed"
    assert [p["value"] for p in shown["series"]] == [0.9, 0.5, 0.2]
    missing = run_cli("experiments", "runs", "nope", "--json")
    assert missing.returncode == 3 and "no experiment named 'nope'" in missing.stderr

    @remote(sagemaker_session=session)
    def logs_metrics() -> int:
        with Run(experiment_name="exp-job", run_name="job-run") as job_run:
            job_run.log_metric("acc", 0.75, step=0)
        return 1

    assert logs_metrics() == 1
    assert json.loads(run_cli("envs", "list", "--json").stdout) == []
    job = json.loads(run_cli("jobs", "list", "--json").stdout)[0]["name"]
    metrics = json.loads(run_cli("jobs", "metrics", job, "--json").stdout)
    assert metrics["job"] == job and isinstance(metrics["metrics"], list)


def test_jobs_logs_tail_prints_only_the_last_lines(session) -> None:
    assert remote(sagemaker_session=session)(_five_lines)() == 5
    name = json.loads(run_cli("jobs", "list", "--json").stdout)[0]["name"]
    full = run_cli("jobs", "logs", name).stdout
    assert all(f"line {i}" in full for i in range(5))
    tail = run_cli("jobs", "logs", name, "--tail", "2")
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.splitlines() == full.splitlines()[-2:]
    followed = run_cli("jobs", "logs", name, "-f", "-n", "1")
    assert followed.returncode == 0 and followed.stdout.splitlines() == full.splitlines()[-1:]
    assert run_cli("jobs", "logs", name, "--tail", "0").stdout == ""


def _flags(help_text: str) -> dict[str, str]:
    """Each --flag of a help text and the '(default ...; env ...)' note of its help."""
    text = " ".join(help_text.split())
    text = text[text.lower().index("options:"):]  # past the usage line
    found: dict[str, str] = {}
    for match in re.finditer(r"(--[a-z][a-z-]+)", text):
        flag = match.group(1)
        if flag in found or flag in ("--help", "--model"):
            continue
        rest = text[match.end():]
        nxt = re.search(r"\s--[a-z]", rest)
        body = rest[: nxt.start()] if nxt else rest
        note = re.search(r"\((default[^)]*|env [^)]*)\)", body)
        found[flag] = note.group(1) if note else ""
    return found


def test_serve_has_the_options_help_and_defaults_of_python_m_shoal_serving(clean_env) -> None:
    module = subprocess.run([sys.executable, "-m", "shoal.serving", "--help"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "200"})
    cli = run_cli("serve", "--help", env={"COLUMNS": "200"})
    assert module.returncode == 0 and cli.returncode == 0, cli.stderr
    ours, theirs = _flags(cli.stdout), _flags(module.stdout)
    assert ours == theirs
    assert {"--host", "--port", "--workers", "--max-batch-size", "--timeout-s",
            "--max-queue"} <= set(ours)
    assert "default 127.0.0.1" in ours["--host"] and "default 8080" in ours["--port"]


def test_every_listing_uses_the_shared_table_style() -> None:
    """No command builds its own rich Table: every listing comes from cli._render.listing
    (key/value grids and the config tables' titles aside)."""
    offenders = []
    for path in (SRC / "cli").glob("*.py"):
        if path.name in ("_render.py", "_config.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Table":
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
