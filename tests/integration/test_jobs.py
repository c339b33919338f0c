"""Job-level guarantees: signed payloads, versions, config defaults, dependencies, slots."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import shoal
from helpers import flip_stored_byte
from shoal import JobFailedError, remote
from shoal.core import FailureKind, JobQuery, JobStatus
from shoal.errors import (
    ConfigError,
    InvalidArgumentError,
    PayloadIntegrityError,
    SchemaOutOfDateError,
)
from shoal.remote_function import RemoteOptions


def double(x):
    return 2 * x


def _submit_without_launch(session, func, *args):
    """Record a job and store its payloads the way submit_function does, but do not launch."""
    from shoal.serialization import serialize
    from shoal.serialization.keys import new_salt, payload_key

    spec = RemoteOptions().build_spec(func, session)
    svc = session.jobs
    salt = new_salt()
    key = payload_key(svc.keys.secret(spec.name, salt))
    record = session.metadata.create_job(spec, key_salt=salt, backend="local")
    svc.put_payload(spec.name, "function", serialize(func, key, what="function"))
    svc.put_payload(spec.name, "arguments", serialize((args, {}), key, what="arguments"))
    return record


def test_tampered_function_payload_is_refused_by_the_job(session):
    record = _submit_without_launch(session, double, 21)
    assert flip_stored_byte(session, record.name, "function") == "database"  # a small payload
    svc = session.jobs
    svc.launch(record)
    final = svc.wait(record.name, timeout=60)
    assert final.status == JobStatus.FAILED
    assert final.failure_kind == FailureKind.INTEGRITY
    assert "HMAC" in final.failure_reason
    with pytest.raises(JobFailedError, match="HMAC"):
        svc.outcome(final)


def test_payload_signed_with_another_key_is_refused(session):
    from shoal.serialization import new_key, serialize

    record = _submit_without_launch(session, double, 21)
    forged = serialize(lambda *a: "forged", new_key(), what="function")
    session.jobs.put_payload(record.name, "function", forged)
    session.jobs.launch(record)
    final = session.jobs.wait(record.name, timeout=60)
    assert final.failure_kind == FailureKind.INTEGRITY


def test_tampered_result_is_refused_by_the_client(session):
    svc = session.jobs
    spec = RemoteOptions().build_spec(double, session)
    record = svc.submit_function(spec, double, (21,), {})
    final = svc.wait(record.name, timeout=60)
    assert svc.outcome(final) == 42
    assert flip_stored_byte(session, record.name, "results") == "database"
    with pytest.raises(PayloadIntegrityError):
        svc.outcome(final)


def test_python_version_mismatch_fails_before_anything_runs(session, tmp_path):
    marker = tmp_path / "ran"

    def touch():
        marker.write_text("ran")

    spec = RemoteOptions().build_spec(touch, session)
    spec = dataclasses.replace(spec, python_version="3.99")
    svc = session.jobs
    record = svc.submit_function(spec, touch, (), {})
    final = svc.wait(record.name, timeout=60)
    assert final.failure_kind == FailureKind.VERSION
    assert "3.99" in final.failure_reason
    assert not marker.exists()


SEED_CONFIG = """\
SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      RemoteFunction:
        InstanceType: ml.m5.large
        Dependencies: ./requirements.txt
        EnvironmentVariables: {"EnvVarKey": "EnvVarValue"}
        Tags:
          - {"Key": "someTagKey", "Value": "someTagValue"}
"""


@pytest.fixture
def seed_config(tmp_path, monkeypatch):
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "requirements.txt").write_text("numpy\n")
    config = workdir / "config.yaml"
    config.write_text(SEED_CONFIG)
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("SHOAL_USER_CONFIG_OVERRIDE", str(config))
    s = shoal.Session(home=str(tmp_path / "home"))
    with shoal.use(s):
        yield s
    s.backend.shutdown_launcher()
    s.close()


def test_seed_config_file_drives_a_bare_remote(seed_config):
    @remote
    def read_env():
        import os

        import numpy

        return os.environ["EnvVarKey"], numpy.__name__

    assert read_env() == ("EnvVarValue", "numpy")
    [record] = seed_config.metadata.list_jobs(JobQuery(name_prefix="read-env-"))
    assert record.spec.instance_type == "ml.m5.large"
    assert record.spec.dependencies == str(Path("requirements.txt").resolve())
    assert ("someTagKey", "someTagValue") in record.spec.tags
    sources = seed_config.defaults.remote_function
    assert "user file" in sources["InstanceType"].source


def test_explicit_arguments_beat_the_config_file(seed_config):
    @remote(instance_type="ml.c5.xlarge", environment_variables={"OTHER": "1"},
            tags=[{"Key": "someTagKey", "Value": "mine"}, {"Key": "team", "Value": "ml"}])
    def read_env():
        import os

        return os.environ.get("EnvVarKey"), os.environ.get("OTHER")

    # An explicit environment_variables dict replaces the configured one.
    assert read_env() == (None, "1")
    [record] = seed_config.metadata.list_jobs(JobQuery(name_prefix="read-env-"))
    assert record.spec.instance_type == "ml.c5.xlarge"
    # Configured tags are appended unless the key is already given.
    assert record.spec.tags == (("someTagKey", "mine"), ("team", "ml"))


def test_missing_requirement_fails_the_environment_phase(session, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("numpy\nsurely-not-a-real-package-shoal==1.0\n")

    @remote(dependencies=str(req))
    def f():
        return 1

    with pytest.raises(JobFailedError, match="surely-not-a-real-package-shoal"):
        f()
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="f-"))
    assert record.failure_kind == FailureKind.ENVIRONMENT


def test_missing_requirements_file_fails_before_any_job(session, tmp_path):
    @remote(dependencies=str(tmp_path / "nope.txt"))
    def f():
        return 1

    with pytest.raises(InvalidArgumentError, match="nope.txt"):
        f()
    assert session.metadata.list_jobs(JobQuery()) == []


def test_bad_config_file_names_file_and_key(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SEED_CONFIG.replace("InstanceType: ml.m5.large", "InstanceType: 5"))
    s = shoal.Session(home=str(tmp_path / "home"), config_files=[bad])

    @remote(sagemaker_session=s)
    def f():
        return 1

    with pytest.raises(ConfigError) as info:
        f()
    assert str(bad) in str(info.value) and "InstanceType" in str(info.value)
    s.close()


def test_configured_database_at_no_schema_says_how_to_upgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'other.db'}"
    s = shoal.Session(home=str(tmp_path / "home"), metadata_url=url)
    with pytest.raises(SchemaOutOfDateError, match="shoal db upgrade"):
        s.metadata  # noqa: B018


def test_slots_bound_how_many_jobs_run_at_once(tmp_path):
    s = shoal.Session(home=str(tmp_path / "home"), max_slots=1)
    try:
        def stamp(i):
            import time

            start = time.time()
            time.sleep(0.3)  # the job's own work; the test itself never sleeps
            return start, time.time()

        with shoal.RemoteExecutor(max_parallel_jobs=3, sagemaker_session=s) as e:
            spans = sorted(f.result() for f in [e.submit(stamp, i) for i in range(3)])
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 0.05  # no two jobs overlapped
    finally:
        s.backend.shutdown_launcher()
        s.close()


def test_describe_record_keeps_the_whole_spec(session):
    @remote(instance_type="ml.m5.large", tags={"project": "demo"}, max_runtime_in_seconds=600)
    def f():
        return 1

    f()
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="f-"))
    assert record.spec.memory_mib == 8 * 1024
    assert record.spec.max_runtime_in_seconds == 600
    assert json.loads(json.dumps(record.spec.to_json()))["tags"] == [["project", "demo"]]
    assert record.env_setup_seconds is not None
