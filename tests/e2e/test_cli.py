"""The ``shoal`` command end to end: real subprocesses against jobs run on the local backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal
from helpers import Followed, cli_test_session, wait_until
from shoal import RemoteExecutor, remote
from shoal.core import JobQuery, JobStatus
from shoal.errors import JobCancelledError

CLI = [sys.executable, "-m", "shoal.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], proc.stderr


@pytest.fixture
def home(clean_env: Path) -> Path:
    return clean_env  # SHOAL_HOME, which the subprocesses inherit


@pytest.fixture
def session(home: Path) -> Iterator[shoal.Session]:
    with cli_test_session(home) as s:
        yield s


def _wait_for_file(path: str) -> str:
    """Job body: print, then wait (bounded) until the test creates *path*."""
    import time

    print("waiting for release", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)  # inside the job: bounded poll for the test's signal
    print("released", flush=True)
    return "done"


def start_waiting_job(session: shoal.Session, release: Path) -> tuple[RemoteExecutor, object, str]:
    executor = RemoteExecutor(sagemaker_session=session)
    future = executor.submit(_wait_for_file, str(release))
    name = wait_until(lambda: future.job_name, 30, what="the job to be submitted")
    wait_until(lambda: b"waiting for release" in session.jobs.read_log(name), 30,
               what=f"job {name} to print")
    assert session.jobs.get(name).status == JobStatus.RUNNING
    return executor, future, name


# --- jobs list ------------------------------------------------------------------------------

def test_jobs_list_filters_by_status_and_name(session):
    @remote(sagemaker_session=session)
    def alpha():
        return 1

    @remote(sagemaker_session=session)
    def beta():
        raise ValueError("beta went wrong")

    assert alpha() == 1
    with pytest.raises(ValueError):
        beta()

    table = run_cli("jobs", "list")
    assert table.returncode == 0, table.stderr
    assert "alpha-" in table.stdout and "beta-" in table.stdout
    assert "completed" in table.stdout and "failed" in table.stdout
    assert "ValueError: beta went wrong" in table.stdout  # the failure reason, shortened

    failed = run_cli("jobs", "list", "--status", "failed", "--json")
    assert failed.returncode == 0, failed.stderr
    [record] = json.loads(failed.stdout)
    assert record["name"].startswith("beta-") and record["status"] == "failed"
    assert record["failure_kind"] == "user_error"

    both = json.loads(run_cli("jobs", "list", "-s", "failed", "-s", "completed", "--json").stdout)
    assert len(both) == 2
    named = json.loads(run_cli("jobs", "list", "--name", "alph", "--since", "1h", "--json").stdout)
    assert [r["name"][:6] for r in named] == ["alpha-"]
    assert json.loads(run_cli("jobs", "list", "--limit", "1", "--json").stdout)[0]["name"] \
        .startswith("beta-")  # newest first


def test_jobs_list_rejects_a_bad_duration_with_a_usage_error(home):
    proc = run_cli("jobs", "list", "--since", "2x")
    assert proc.returncode == 2
    assert "--since" in proc.stderr and "Traceback" not in proc.stderr


# --- jobs describe --------------------------------------------------------------------------

def test_describe_shows_every_field_and_masks_secret_values(session):
    @remote(sagemaker_session=session, instance_type="ml.m5.large",
            environment_variables={"API_TOKEN": "abc123", "PLAIN_SETTING": "visible"},
            tags=[{"Key": "team", "Value": "ml"}], role="arn:aws:iam::1:role/demo")
    def configured():
        return 0

    assert configured() == 0
    name = session.metadata.list_jobs(JobQuery(name_prefix="configured-"))[0].name

    text = run_cli("jobs", "describe", name)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert "abc123" not in out
    assert "API_TOKEN" in out and "****" in out
    assert "PLAIN_SETTING" in out and "visible" in out
    for needle in (name, "completed", "ml.m5.large", "team", "ml", "role", "arn:aws:iam::1:role/demo",
                   "pending", "starting", "running", "exit code", "env setup", "attempt",
                   f"{name}/logs/output.log", f"shoal jobs logs {name}"):
        assert needle in out, needle

    as_json = run_cli("jobs", "describe", name, "--json")
    assert as_json.returncode == 0 and "abc123" not in as_json.stdout
    data = json.loads(as_json.stdout)
    assert data["spec"]["environment_variables"] == {"API_TOKEN": "****",
                                                     "PLAIN_SETTING": "visible"}
    assert data["spec"]["inert_settings"] == {"role": "arn:aws:iam::1:role/demo"}
    assert [e["status"] for e in data["events"]] == ["pending", "starting", "running", "completed"]
    assert data["exit_code"] == 0 and data["attempt"] == 1
    assert data["log_uri"].endswith(f"{name}/logs/output.log")


def test_unknown_job_exits_3_with_one_line(home):
    for args in (("jobs", "describe", "no-such-job"), ("jobs", "logs", "no-such-job"),
                 ("jobs", "logs", "no-such-job", "-f"), ("jobs", "cancel", "no-such-job")):
        proc = run_cli(*args)
        assert proc.returncode == 3, (args, proc.stderr)
        assert_one_line_error(proc, "no-such-job")


def test_verbose_shows_the_traceback(home):
    proc = run_cli("-v", "jobs", "describe", "no-such-job")
    assert proc.returncode == 3
    assert "Traceback" in proc.stderr and "JobNotFound" in proc.stderr


# --- jobs logs ------------------------------------------------------------------------------

def test_logs_print_what_the_function_printed(session):
    @remote(sagemaker_session=session)
    def chatty():
        print("hello from the job")
        raise RuntimeError("and then it failed")

    with pytest.raises(RuntimeError):
        chatty()
    name = session.metadata.list_jobs(JobQuery(name_prefix="chatty-"))[0].name

    proc = run_cli("jobs", "logs", name)
    assert proc.returncode == 0, proc.stderr
    assert "hello from the job" in proc.stdout

    followed = run_cli("jobs", "logs", name, "--follow")  # already ended: print, report, exit
    assert followed.returncode == 1  # it failed
    assert "hello from the job" in followed.stdout
    assert f"job {name} failed" in followed.stderr


def test_logs_follow_streams_a_running_job_until_it_ends(session, tmp_path):
    release = tmp_path / "release"
    executor, future, name = start_waiting_job(session, release)
    with Followed([*CLI, "jobs", "logs", name, "-f"]) as followed:
        wait_until(lambda: "waiting for release\n" in followed.lines, 30,
                   what="the followed log")
        assert followed.proc.poll() is None  # still following: the job has not ended
        release.touch()
        assert followed.wait(timeout=60) == 0  # the job completed
        assert "released\n" in followed.lines
        assert f"job {name} completed" in followed.stderr()
    assert future.result(timeout=30) == "done"
    executor.shutdown()


# --- jobs cancel ----------------------------------------------------------------------------

def test_cancel_wait_stops_a_running_job(session, tmp_path):
    executor, future, name = start_waiting_job(session, tmp_path / "never-created")

    proc = run_cli("jobs", "cancel", name, "--wait")
    assert proc.returncode == 0, proc.stderr
    assert f"job {name} stopped" in proc.stdout
    record = session.jobs.get(name)
    assert record.status == JobStatus.STOPPED
    assert [e.status for e in record.events][-2:] == [JobStatus.STOPPING, JobStatus.STOPPED]
    assert isinstance(future.exception(timeout=30), JobCancelledError)
    executor.shutdown()

    again = run_cli("jobs", "cancel", name)
    assert again.returncode == 0 and "already ended: stopped" in again.stdout
    followed = run_cli("jobs", "logs", name, "-f")
    assert followed.returncode == 5  # stopped
    assert "waiting for release" in followed.stdout


def test_cancel_without_wait_requests_the_stop(session, tmp_path):
    executor, future, name = start_waiting_job(session, tmp_path / "never-created")
    proc = run_cli("jobs", "cancel", name)
    assert proc.returncode == 0, proc.stderr
    assert f"stop requested for job {name}" in proc.stdout
    record = session.jobs.wait(name, timeout=30)
    assert record.status == JobStatus.STOPPED
    assert isinstance(future.exception(timeout=30), JobCancelledError)
    executor.shutdown()


# --- config show ----------------------------------------------------------------------------

_USER_CONFIG = """\
SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      RemoteFunction:
        InstanceType: ml.m5.large
        EnvironmentVariables: {"DB_PASSWORD": "hunter2", "REGION": "local"}
"""


def test_config_show_names_each_value_and_its_file(home, tmp_path):
    user = tmp_path / "user-config.yaml"
    user.write_text(_USER_CONFIG)
    extra = tmp_path / "extra.yaml"
    extra.write_text("SageMaker:\n  PythonSDK:\n    Modules:\n      RemoteFunction:\n"
                     "        InstanceType: ml.c5.xlarge\n")
    env = {"SHOAL_USER_CONFIG_OVERRIDE": str(user)}

    proc = run_cli("config", "show", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "InstanceType" in proc.stdout and "ml.m5.large" in proc.stdout
    assert str(user) in proc.stdout
    assert "hunter2" not in proc.stdout and "REGION" in proc.stdout
    assert "env SHOAL_HOME" in proc.stdout and "env SHOAL_USER_CONFIG_OVERRIDE" in proc.stdout

    data = json.loads(run_cli("config", "show", "--config", str(extra), "--json", env=env).stdout)
    keys = {row["key"]: row for row in data["remote_function"]}
    assert keys["InstanceType"]["value"] == "ml.c5.xlarge"
    assert keys["InstanceType"]["source"] == f"extra file {extra}"
    assert keys["EnvironmentVariables"]["source"] == f"user file {user}"
    assert keys["EnvironmentVariables"]["value"] == {"DB_PASSWORD": "****", "REGION": "local"}
    settings = {row["name"]: row for row in data["settings"]}
    assert settings["home"] == {"name": "home", "value": str(home), "source": "env SHOAL_HOME"}
    assert settings["backend"]["source"] == "default"
    files = {f["label"]: f for f in data["files"]}
    assert files["user"]["found"] and files["extra"]["found"] and not files["admin"]["found"]


def test_bad_config_file_exits_4_naming_file_and_key(home, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("SageMaker:\n  PythonSDK:\n    Modules:\n      RemoteFunction:\n"
                   "        InstanceTyp: ml.m5.large\n")
    proc = run_cli("config", "show", env={"SHOAL_USER_CONFIG_OVERRIDE": str(bad)})
    assert proc.returncode == 4
    assert_one_line_error(proc, str(bad), "InstanceTyp")

    missing = run_cli("config", "show", "--config", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 4
    assert_one_line_error(missing, "missing.yaml")

    settings = run_cli("jobs", "list", env={"SHOAL_MAX_SLOTS": "many"})
    assert settings.returncode == 4
    assert_one_line_error(settings, "max_slots")


# --- db upgrade -----------------------------------------------------------------------------

def test_db_upgrade_creates_the_schema_a_configured_database_needs(home, tmp_path):
    url = f"sqlite:///{tmp_path / 'team.db'}"
    env = {"SHOAL_METADATA_URL": url}
    before = run_cli("jobs", "list", env=env)
    assert before.returncode == 4
    assert_one_line_error(before, f"shoal db upgrade {url}")

    upgraded = run_cli("db", "upgrade", url)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "schema revision" in upgraded.stdout and url in upgraded.stdout
    assert run_cli("db", "upgrade", url).returncode == 0  # idempotent

    after = run_cli("jobs", "list", "--json", env=env)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == []


def test_db_upgrade_defaults_to_the_configured_database(home, tmp_path):
    other = tmp_path / "other-home"
    proc = run_cli("--home", str(other), "db", "upgrade")
    assert proc.returncode == 0, proc.stderr
    assert str(other / "shoal.db") in proc.stdout
    assert (other / "shoal.db").exists()


# --- the command itself ---------------------------------------------------------------------

def test_help_is_fast_and_documents_exit_codes(home):
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "Exit status" in proc.stdout and "jobs" in proc.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, shoal.cli; heavy = [m for m in ('sqlalchemy', "
         "'fsspec', 'pydantic_settings', 'numpy', 'cloudpickle') if m in sys.modules]; "
         "print(heavy)"], capture_output=True, text=True, timeout=60, check=True)
    assert probe.stdout.strip() == "[]"


def test_describe_shows_a_training_job(session, tmp_path):
    from shoal.estimator import Estimator

    script = tmp_path / "train.py"
    script.write_text("print('acc=0.9')\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.csv").write_text("1\n")
    with shoal.use(session):
        est = Estimator(entry_point=str(script), hyperparameters={"epochs": 2},
                        metric_definitions=[{"Name": "acc", "Regex": r"acc=([0-9.]+)"}])
        est.fit({"training": str(data)}, logs=False)
    proc = run_cli("jobs", "describe", est.latest_training_job.name)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # rich may wrap long values
    assert "Training" in proc.stdout and "entry point train.py" in text
    assert "hyperparameter epochs 2" in text
    assert f"channel training {data.as_uri()}" in text
    assert "model.tar.gz" in text and "metric acc" in text
