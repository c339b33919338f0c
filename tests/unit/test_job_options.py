"""One declaration per knob (issue #18, item 4): @remote, RemoteExecutor and Estimator check,
default and type the knobs every job has in one place (JobOptions) and build their JobSpec
through one function (job_spec)."""

from __future__ import annotations

from pathlib import Path

import pytest

import shoal
from shoal import RemoteExecutor, remote
from shoal.core.jobs import Distribution, JobKind, JobName, JobSpec
from shoal.errors import InvalidArgumentError
from shoal.estimator import Estimator
from shoal.jobs.options import JobOptions, job_spec
from shoal.remote_function._options import RemoteOptions


def _f() -> None:
    return None


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


@pytest.mark.parametrize("bad", [-1, 3601, 7200, True, "30"])
def test_keep_alive_is_checked_alike_by_remote_the_executor_and_the_estimator(bad, script):
    messages = []
    for make in (lambda: remote(keep_alive_period_in_seconds=bad),
                 lambda: RemoteExecutor(keep_alive_period_in_seconds=bad),
                 lambda: Estimator(entry_point=script, keep_alive_period_in_seconds=bad)):
        with pytest.raises(InvalidArgumentError) as e:
            make()
        messages.append(str(e.value))
    assert len(set(messages)) == 1, messages
    assert "keep_alive_period_in_seconds" in messages[0] and "0 to 3600" in messages[0]


def test_keep_alive_is_float_seconds_on_every_spec(tmp_path, script):
    session = shoal.Session(home=str(tmp_path / "home"))
    remote_spec = RemoteOptions(keep_alive_period_in_seconds=30).build_spec(_f, session)
    est = Estimator(entry_point=script, keep_alive_period_in_seconds=30,
                    sagemaker_session=session)
    script_spec = est._spec("train-job", {}, session, None, None)
    for spec in (remote_spec, script_spec):
        assert spec.keep_alive_period_in_seconds == 30.0
        assert type(spec.keep_alive_period_in_seconds) is float
    assert est.keep_alive_period_in_seconds == 30.0


def test_a_script_job_on_ray_gets_no_warm_default(tmp_path, script):
    """The backend's keep-alive default is for function jobs (warm supervisor actors)."""
    ray = shoal.Session(home=str(tmp_path / "home"), backend="ray",
                        ray_address="127.0.0.1:6379", ray_keep_alive_seconds=60)
    assert RemoteOptions().build_spec(_f, ray).keep_alive_period_in_seconds == 60.0
    est = Estimator(entry_point=script, sagemaker_session=ray)
    assert est._spec("train-job", {}, ray, None, None).keep_alive_period_in_seconds == 0.0


def test_the_estimator_names_its_own_knobs_in_errors(script):
    with pytest.raises(InvalidArgumentError, match="max_run must be a positive integer"):
        Estimator(entry_point=script, max_run=0)
    with pytest.raises(InvalidArgumentError, match="environment must map str to str"):
        Estimator(entry_point=script, environment={"A": 1})
    with pytest.raises(InvalidArgumentError, match="max_runtime_in_seconds must be a positive"):
        remote(max_runtime_in_seconds=0)
    with pytest.raises(InvalidArgumentError, match="environment_variables must map str to str"):
        JobOptions(environment_variables={"A": 1})  # type: ignore[dict-item]


def test_remote_and_the_estimator_build_the_same_resources(tmp_path, script):
    """Both go through job_spec: one instance type gives one set of resources."""
    session = shoal.Session(home=str(tmp_path / "home"))
    remote_spec = RemoteOptions(instance_type="ml.m5.xlarge", max_retry_attempts=2,
                                environment_variables={"A": "1"}).build_spec(_f, session)
    est = Estimator(entry_point=script, instance_type="ml.m5.xlarge", max_retry_attempts=2,
                    environment={"A": "1"}, sagemaker_session=session)
    script_spec = est._spec("train-job", {}, session, None, None)
    same = ("instance_type", "cpus", "memory_mib", "gpus", "max_retry_attempts",
            "environment_variables", "python_version")
    assert {k: getattr(remote_spec, k) for k in same} == \
        {k: getattr(script_spec, k) for k in same}
    assert remote_spec.cpus == 4.0 and remote_spec.memory_mib == 16 * 1024
    assert (remote_spec.kind, script_spec.kind) == (JobKind.FUNCTION, JobKind.SCRIPT)
    assert script_spec.training is not None and script_spec.training.entry_point == "train.py"
    assert script_spec.distribution == Distribution(hosts=1, per_host=1, torchrun=False)
    assert remote_spec.distribution is None  # one process


def test_job_spec_takes_the_ranks_from_the_options(tmp_path):
    session = shoal.Session(home=str(tmp_path / "home"))
    options = JobOptions(instance_type="ml.m5.large", instance_count=2)
    spec = job_spec(options, session.settings, name="j", kind=JobKind.FUNCTION,
                    function_name="m.f", distribution=options.ranks(torchrun=True))
    assert spec.distribution == Distribution(hosts=2, per_host=1, torchrun=True)
    assert options.ranks(torchrun=True, per_host=3).world == 6


def test_a_spec_records_where_each_option_came_from(tmp_path):
    from shoal.config import load_defaults

    admin, user = tmp_path / "admin.yaml", tmp_path / "user.yaml"
    admin.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                     "      RemoteFunction:\n        InstanceType: ml.m5.large\n"
                     "        Tags:\n          - {Key: team, Value: vision}\n")
    user.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                    "      RemoteFunction:\n        EnvironmentVariables: {MODE: fast}\n")
    defaults = load_defaults([("admin", admin), ("user", user)])
    options = RemoteOptions(max_retry_attempts=3, max_runtime_in_seconds=24 * 3600,
                            tags={"run": "7"})
    sources = options.sources(defaults)
    assert sources["instance_type"] == f"admin file {admin}"
    assert sources["environment_variables"] == f"user file {user}"
    assert sources["max_retry_attempts"] == "explicit argument"
    assert sources["tags"] == f"explicit argument, then admin file {admin}"  # merged
    assert "max_runtime_in_seconds" not in sources  # passed, but its default: "*"
    assert sources["*"] == "default"
    session = shoal.Session(home=str(tmp_path / "home"))
    spec = options.build_spec(_f, session)
    assert spec.option_sources["max_retry_attempts"] == "explicit argument"
    assert JobSpec.from_json(spec.to_json()).option_sources == spec.option_sources


def test_a_spec_recorded_before_option_sources_reads_as_none_recorded():
    data = JobSpec(name=JobName("old-job")).to_json()
    del data["option_sources"]
    assert JobSpec.from_json(data).option_sources == {}


def test_an_estimators_spec_records_its_explicit_arguments(tmp_path, script):
    session = shoal.Session(home=str(tmp_path / "home"))
    est = Estimator(entry_point=script, instance_type="ml.m5.large", max_run=3600,
                    environment={"MODE": "fast"}, sagemaker_session=session)
    sources = est._spec("train-job", {}, session, None, None).option_sources
    assert sources == {"*": "default", "instance_type": "explicit argument",
                       "max_runtime_in_seconds": "explicit argument",
                       "environment_variables": "explicit argument"}
