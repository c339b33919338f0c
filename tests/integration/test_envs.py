"""Isolated environments: built with uv from PyPI, cached by lock, built once, never half-done."""

from __future__ import annotations

import json

import pytest

from shoal import JobFailedError, RemoteExecutor, remote
from shoal.core import FailureKind, JobQuery
from shoal.envs import UvEnvBuilder

pytestmark = pytest.mark.slow


def _six_version():
    import six

    return six.__version__


def _builder(session):
    return UvEnvBuilder(session.home / "envs")


def test_job_runs_in_an_isolated_env_holding_exactly_its_requirements(session, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")

    @remote(dependencies=str(req))
    def probe():
        import importlib.util
        import sys

        import six

        return six.__version__, importlib.util.find_spec("sqlalchemy") is None, sys.prefix

    version, no_sqlalchemy, prefix = probe()
    assert version == "1.16.0"
    assert no_sqlalchemy  # the client's packages are not visible in the job
    [env] = _builder(session).list()
    assert prefix == str(env.path)
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="probe-"))
    lock = session.artifacts.get_bytes(f"{record.name}/env/requirements.lock").decode()
    assert "six==1.16.0" in lock and "cloudpickle==" in lock
    assert record.env_setup_seconds is not None and record.env_setup_seconds > 0


def test_concurrent_jobs_build_one_env_and_equivalent_requests_share_it(session, tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("six==1.16.0\n")
    b.write_text("six>=1.16,<1.17  # resolves to the same lock\n")
    with RemoteExecutor(max_parallel_jobs=2, dependencies=str(a)) as e:
        futures = [e.submit(_six_version) for _ in range(2)]
    assert [f.result() for f in futures] == ["1.16.0", "1.16.0"]
    assert remote(dependencies=str(b))(_six_version)() == "1.16.0"
    envs = _builder(session).list()
    assert len(envs) == 1
    logs = [session.jobs.read_log(f.job_name).decode() for f in futures]
    assert sum("building an environment" in log for log in logs) == 1


def test_package_that_does_not_exist_fails_with_the_resolver_message(session, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("shoal-surely-not-a-real-package==9.9.9\n")

    with pytest.raises(JobFailedError) as info:
        remote(dependencies=str(req))(_six_version)()
    assert "shoal-surely-not-a-real-package" in str(info.value)
    [record] = session.metadata.list_jobs(JobQuery())
    assert record.failure_kind == FailureKind.ENVIRONMENT
    assert _builder(session).list() == []
    assert not list((session.home / "envs").glob(".build-*"))


def test_conflicting_pins_fail_and_cache_nothing(session, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\nsix==1.17.0\n")
    with pytest.raises(JobFailedError, match="six"):
        remote(dependencies=str(req))(_six_version)()
    assert _builder(session).list() == []


def test_shell_metacharacters_never_reach_a_shell(session, tmp_path):
    canary = tmp_path / "canary"
    req = tmp_path / "requirements.txt"
    req.write_text(f"six==1.16.0; touch {canary}\nsix && touch {canary}\n")
    with pytest.raises(JobFailedError):
        remote(dependencies=str(req))(_six_version)()
    assert not canary.exists()
    assert _builder(session).list() == []


def test_prune_removes_unused_environments(session, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    remote(dependencies=str(req))(_six_version)()
    builder = _builder(session)
    [env] = builder.list()
    assert builder.prune(unused_for_seconds=3600) == []
    assert builder.prune(unused_for_seconds=0) == [env.key]
    assert builder.list() == [] and not env.path.exists()


def test_pre_execution_commands_run_first_and_their_output_is_logged(session, tmp_path):
    marker = tmp_path / "prepared"

    @remote(pre_execution_commands=["echo setting up", f"echo ready > {marker}"])
    def read_marker():
        return marker.read_text().strip()

    assert read_marker() == "ready"
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="read-marker-"))
    log = session.jobs.read_log(record.name).decode()
    assert "$ echo setting up" in log and "setting up\n" in log


def test_failing_pre_execution_command_fails_the_job_with_its_output(session, tmp_path):
    ran = tmp_path / "function-ran"

    @remote(pre_execution_commands=["echo about to fail", "exit 7", "echo never"])
    def never():
        ran.write_text("x")

    with pytest.raises(JobFailedError, match="exit 7") as info:
        never()
    assert "code 7" in str(info.value)
    assert not ran.exists()
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="never-"))
    assert record.failure_kind == FailureKind.ENVIRONMENT
    log = session.jobs.read_log(record.name).decode()
    assert "about to fail" in log and "$ echo never" not in log


def test_pre_execution_script_runs_in_the_isolated_env(session, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    script = tmp_path / "setup.sh"
    out = tmp_path / "which-python"
    script.write_text(f"python -c 'import six, sys; print(sys.prefix)' > {out}\n")

    @remote(dependencies=str(req), pre_execution_script=str(script))
    def f():
        return 1

    assert f() == 1
    [env] = _builder(session).list()
    assert out.read_text().strip() == str(env.path)


def test_pre_execution_commands_and_script_together_are_refused(session, tmp_path):
    script = tmp_path / "s.sh"
    script.write_text("true\n")
    with pytest.raises(ValueError, match="not both"):
        remote(pre_execution_commands=["true"], pre_execution_script=str(script))(
            _six_version)()
    assert session.metadata.list_jobs(JobQuery()) == []


def test_auto_capture_pins_what_the_function_needs(session):
    import yaml

    @remote(dependencies="auto_capture")
    def uses_yaml():
        import importlib.util

        return yaml.__version__, importlib.util.find_spec("sqlalchemy") is None

    version, no_sqlalchemy = uses_yaml()
    assert version == yaml.__version__ and no_sqlalchemy  # pinned, and nothing else came along
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="uses-yaml-"))
    requested = session.artifacts.get_bytes(f"{record.name}/env/requirements.txt").decode()
    assert f"pyyaml=={yaml.__version__}" in requested.lower()
    lock = session.artifacts.get_bytes(f"{record.name}/env/requirements.lock").decode()
    assert f"pyyaml=={yaml.__version__}" in lock.lower()


PROBE_BACKEND = '''
import json, os

def _record():
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump(dict(os.environ), f)
    raise RuntimeError("the probe only looks")

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _record()
'''


@pytest.mark.parametrize("withhold", [True, False])
def test_a_build_of_the_requirements_gets_no_credentials_when_withheld(tmp_path, monkeypatch,
                                                                        withhold):
    """An sdist's build code is the requirements' author's: an endpoint a team server started
    builds its model's environment without the server's credentials (a real uv, a local
    package whose in-tree build backend records what it was given; no index needed)."""
    from shoal.errors import RuntimeEnvError

    pkg = tmp_path / "probe"
    pkg.mkdir()
    (pkg / "probe_backend.py").write_text(PROBE_BACKEND)
    (pkg / "pyproject.toml").write_text(
        '[project]\nname = "probe"\nversion = "0.1"\n\n[build-system]\nrequires = []\n'
        'build-backend = "probe_backend"\nbackend-path = ["."]\n')
    out = tmp_path / "seen.json"
    monkeypatch.setenv("PROBE_OUT", str(out))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "server-secret")
    monkeypatch.setenv("SHOAL_METADATA_URL", "postgresql://shoal:db-secret@db/shoal")
    builder = UvEnvBuilder(tmp_path / "envs", withhold_credentials=withhold)
    with pytest.raises(RuntimeEnvError, match="the probe only looks"):
        builder.ensure("./probe\n", base_dir=tmp_path)
    seen = json.loads(out.read_text())
    assert seen["PROBE_OUT"] == str(out)  # the rest of the environment is there
    assert ("AWS_SECRET_ACCESS_KEY" in seen) is not withhold
    assert ("SHOAL_METADATA_URL" in seen) is not withhold
