"""``shoal jobs submit``, ``shoal jobs delete`` and ``shoal gc`` (issue #17 item 6), as real
subprocesses on real jobs, SQLite and local artifacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal
from helpers import cli_test_session, wait_until
from shoal import RemoteExecutor, remote
from shoal.core import JobStatus
from shoal.experiments import Run

CLI = [sys.executable, "-m", "shoal.cli"]


def run_cli(*args: str, cwd: Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ), stdin=subprocess.DEVNULL, cwd=cwd)


@pytest.fixture
def session(clean_env: Path) -> Iterator[shoal.Session]:
    with cli_test_session(clean_env) as s:  # SHOAL_HOME of the CLI
        yield s


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.txt").write_text("shipped\n")
    (project / "train.py").write_text(
        "import os, sys\n"
        "print('data:', open('data.txt').read().strip(), flush=True)\n"
        "print('args:', sys.argv[1:], 'GREETING:', os.environ.get('GREETING'), flush=True)\n"
        "sys.exit(int(os.environ.get('EXIT_WITH', '0')))\n")
    return project


def test_submit_runs_a_command_in_a_copy_of_this_directory(session, tmp_path) -> None:
    project = _project(tmp_path)
    done = run_cli("jobs", "submit", "--follow", "--env", "GREETING=hi", "--", "python",
                   "train.py", "--epochs", "3", cwd=project)
    assert done.returncode == 0, done.stderr
    assert "data: shipped" in done.stdout
    assert "args: ['--epochs', '3'] GREETING: hi" in done.stdout
    [record] = session.metadata.list_jobs(shoal.core.JobQuery())
    assert record.name.startswith("train-") and record.status == JobStatus.COMPLETED

    failed = run_cli("jobs", "submit", "--name", "exits", "--env", "EXIT_WITH=3", "--",
                     "python", "train.py", cwd=project)
    assert failed.returncode == 3, failed.stderr  # the command's exit code
    assert "exits-" in failed.stderr and "failed" in failed.stderr

    detached = run_cli("jobs", "submit", "--no-wait", "--", "python", "train.py", cwd=project)
    assert detached.returncode == 0, detached.stderr
    name = detached.stdout.strip()
    record = session.jobs.wait(name, timeout=120)
    assert record.status == JobStatus.COMPLETED
    assert b"data: shipped" in session.jobs.read_log(name)


def test_submit_refuses_a_bad_env_pair(session, tmp_path) -> None:
    proc = run_cli("jobs", "submit", "--env", "NOEQUALS", "--", "python", "x.py", cwd=tmp_path)
    assert proc.returncode == 2 and "KEY=VALUE" in proc.stderr


def _wait_for(path: str) -> str:
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)  # inside the job: bounded poll for the test's signal
    return "released"


def _artifact_dir(session: shoal.Session, name: str) -> Path:
    return Path(session.artifacts.local_path(name))  # type: ignore[arg-type]


def test_delete_removes_records_artifacts_and_logs_and_refuses_running_jobs(session,
                                                                             tmp_path) -> None:
    @remote(sagemaker_session=session)
    def done() -> int:
        print("output to delete")
        return 1

    assert done() == 1
    name = session.metadata.list_jobs(shoal.core.JobQuery())[0].name
    assert _artifact_dir(session, name).is_dir()
    supervisor_log = session.home / "run" / "supervisors" / f"{name}.log"

    dry = json.loads(run_cli("jobs", "delete", name, "--dry-run", "--json").stdout)
    assert dry["dry_run"] is True and dry["jobs"] == [name] and dry["bytes"] > 0
    assert session.metadata.find_job(name) is not None

    deleted = run_cli("jobs", "delete", name)
    assert deleted.returncode == 0, deleted.stderr
    assert f"removed job {name}" in deleted.stdout and "removed 1 job(s)" in deleted.stderr
    assert session.metadata.find_job(name) is None
    assert session.metadata.get_job_payload(name, "results") is None  # the row went too
    assert not _artifact_dir(session, name).exists() and not supervisor_log.exists()
    assert run_cli("jobs", "delete", name).returncode == 3  # gone

    executor = RemoteExecutor(sagemaker_session=session)
    release = tmp_path / "release"
    future = executor.submit(_wait_for, str(release))
    running = wait_until(lambda: future.job_name, 30, what="the job to be submitted")
    wait_until(lambda: session.jobs.get(running).status == JobStatus.RUNNING, 60,
               what="the job to run")
    refused = run_cli("jobs", "delete", running)
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert session.metadata.find_job(running) is not None
    forced = run_cli("jobs", "delete", running, "--force")
    assert forced.returncode == 0, forced.stderr
    assert session.metadata.find_job(running) is None
    executor.shutdown(wait=False)


def test_gc_dry_run_counts_then_removes_old_jobs_runs_and_experiments(session) -> None:
    @remote(sagemaker_session=session)
    def work(i: int) -> int:
        return i

    assert [work(i) for i in range(2)] == [0, 1]
    with Run(experiment_name="old-exp", run_name="r1", sagemaker_session=session) as run:
        run.log_metric("loss", 0.5, step=0)
        run.log_artifact("notes", "file:///not/ours")  # not in shoal's store: kept as is

    young = json.loads(run_cli("gc", "--older-than", "1d", "--json").stdout)
    assert young["jobs"] == [] and young["runs"] == [] and young["experiments"] == []

    dry = run_cli("gc", "--older-than", "0s", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] is True and len(plan["jobs"]) == 2 and plan["bytes"] > 0
    assert plan["runs"] == [{"experiment_name": "old-exp", "run_name": "r1"}]
    assert plan["experiments"] == ["old-exp"]
    assert len(session.metadata.list_jobs(shoal.core.JobQuery())) == 2  # nothing went

    only_failed = json.loads(run_cli("gc", "--older-than", "0s", "--status", "failed",
                                     "--dry-run", "--json").stdout)
    assert only_failed["jobs"] == [] and only_failed["runs"] == []

    done = run_cli("gc", "--older-than", "0s")
    assert done.returncode == 0, done.stderr
    assert "removed 2 job(s), 1 run(s), 1 experiment(s)" in done.stderr
    assert session.metadata.list_jobs(shoal.core.JobQuery()) == []
    assert session.metadata.list_experiments() == []
    assert session.metadata.get_metrics("run:old-exp/r1") == []
    bad = run_cli("gc", "--older-than", "soon")
    assert bad.returncode == 2 and "--older-than" in bad.stderr
