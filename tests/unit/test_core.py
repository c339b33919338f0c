"""core: job lifecycle, JobSpec persistence, instance types and job names."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest

from helpers import old_shape_spec
from shoal.core import (
    INSTANCE_TYPES,
    TRANSITIONS,
    JobKind,
    JobName,
    JobSpec,
    JobStatus,
    RandomIdFactory,
    check_transition,
    job_name_for,
    resolve_instance_type,
)
from shoal.core.jobs import (
    BatchRef,
    ClientRef,
    Distribution,
    RunRef,
    TrainingSpec,
    Workdir,
)
from shoal.errors import InvalidArgumentError, InvalidTransitionError

TERMINAL = {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED}
ALLOWED = sorted((a, b) for a, targets in TRANSITIONS.items() for b in targets)
FORBIDDEN = sorted((a, b) for a in JobStatus for b in JobStatus
                   if b not in TRANSITIONS[a])


# --- transitions --------------------------------------------------------------------------

def test_every_status_has_a_transition_entry() -> None:
    assert set(TRANSITIONS) == set(JobStatus)


def test_terminal_statuses() -> None:
    assert {s for s in JobStatus if s.is_terminal} == TERMINAL
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()


def test_the_happy_path_and_retry_are_allowed() -> None:
    for a, b in [("pending", "starting"), ("starting", "running"), ("running", "completed"),
                 ("running", "failed"), ("running", "stopping"), ("stopping", "stopped"),
                 ("starting", "pending"), ("running", "pending"), ("pending", "stopped")]:
        assert JobStatus(b) in TRANSITIONS[JobStatus(a)], (a, b)


def test_every_live_status_can_fail() -> None:
    for status in JobStatus:
        if not status.is_terminal:
            assert JobStatus.FAILED in TRANSITIONS[status]


@pytest.mark.parametrize(("current", "new"), ALLOWED, ids=lambda s: str(s))
def test_allowed_transition(current: JobStatus, new: JobStatus) -> None:
    check_transition("job-a", current, new)


@pytest.mark.parametrize(("current", "new"), FORBIDDEN, ids=lambda s: str(s))
def test_forbidden_transition(current: JobStatus, new: JobStatus) -> None:
    with pytest.raises(InvalidTransitionError) as info:
        check_transition("job-a", current, new)
    err = info.value
    assert "job-a" in str(err) and str(current) in str(err) and str(new) in str(err)
    assert err.details == {"job": "job-a", "current": str(current), "new": str(new)}
    if current.is_terminal:
        assert "already ended" in str(err)


def test_no_status_moves_to_itself() -> None:
    for status in JobStatus:
        assert status not in TRANSITIONS[status]


# --- JobSpec ------------------------------------------------------------------------------

def _full_spec() -> JobSpec:
    return JobSpec(
        name=JobName("train-250101-120000-abc123"),
        kind=JobKind.SCRIPT,
        function_name="pkg.mod:train",
        instance_type="ml.m5.xlarge",
        cpus=4.0,
        memory_mib=16384,
        gpus=1,
        allow_cpu_fallback=True,
        environment_variables={"A": "1", "B": "two"},
        dependencies="./requirements.txt",
        max_runtime_in_seconds=600,
        max_retry_attempts=3,
        stop_grace_period_in_seconds=2.5,
        tags=(("team", "ml"), ("cost", "low")),
        python_version="3.11",
        inert_settings={"RoleArn": "arn:aws:iam::1:role/x", "VpcConfig": {"Subnets": ["s"]}},
        sys_path=("/src", "/lib"),
        run=RunRef("exp", "run-1"),
        conda_env="base",
        gpu_fallback="ran on CPU: ml.g5.xlarge asks for 1 GPU(s); this machine has 0",
        strict_versions=True,
        distribution=Distribution(hosts=2, per_host=4, torchrun=True),
        checkpoint_s3_uri="file:///ck",
        workdir=Workdir("ab" * 32, files=3, size_bytes=120),
        training=TrainingSpec(
            entry_point="train.py", source_key="j/source/sourcedir.tar.gz",
            source_uri="file:///a/j/source/sourcedir.tar.gz", hyperparameters={"epochs": 2},
            channels={"train": {"uri": "file:///data", "input_mode": "File"}},
            output_path="file:///out", output_root="file:///a",
            metric_definitions=({"Name": "loss", "Regex": "loss=([0-9.]+)"},),
            checkpoint_s3_uri="file:///ck", checkpoint_local_path="/opt/ml/checkpoints",
            instance_count=2, volume_size=40, input_mode="File",
            distribution_config={"torch_distributed": {"enabled": True}},
            framework=("torch", "torch==2.3.*"), framework_module="m", estimator="PyTorch"),
        sagemaker_alias=True,
        framework_notices=("a notice",),
        batch=BatchRef("b1", 3),
        client=ClientRef("host-a", 123, 456),
    )




@pytest.mark.parametrize("spec", [JobSpec(name=JobName("minimal")), _full_spec()],
                         ids=["minimal", "full"])
def test_job_spec_json_round_trip(spec: JobSpec) -> None:
    wire = json.loads(json.dumps(spec.to_json()))
    back = JobSpec.from_json(wire)
    assert back == spec
    assert isinstance(back.kind, JobKind)
    assert isinstance(back.tags, tuple) and all(isinstance(t, tuple) for t in back.tags)
    assert back.to_json() == spec.to_json()


def test_a_spec_stored_before_the_typed_fields_loads_into_them() -> None:
    """Records written with the old ``extra`` mapping keep loading (issue #18, item 3)."""
    spec = JobSpec.from_json(json.loads(json.dumps(old_shape_spec("train-250101-120000-abc123"))))
    training = spec.training
    assert training is not None and training.entry_point == "train.py"
    assert training.hyperparameters == {"epochs": 2}
    assert training.channels["train"]["uri"] == "file:///data"
    assert training.metric_definitions == ({"Name": "loss", "Regex": "loss=([0-9.]+)"},)
    assert training.checkpoint_s3_uri == "file:///ck" and training.instance_count == 2
    assert training.framework == ("torch", "torch==2.3.*") and training.estimator == "PyTorch"
    assert training.model_data(spec.name, "unused") == \
        f"file:///a/{spec.name}/output/model.tar.gz"
    assert spec.distribution == Distribution(hosts=2, per_host=1, torchrun=True)
    assert spec.run == RunRef("exp", "r1") and spec.batch == BatchRef("b7", 2)
    assert spec.client == ClientRef("host-a", 42, 1234)
    assert spec.workdir == Workdir("cd" * 32, files=4, size_bytes=99)
    assert spec.sagemaker_alias and spec.strict_versions
    assert spec.framework_notices == ("n1",) and spec.sys_path == ("/src",)
    assert (spec.conda_env, spec.gpu_fallback, spec.checkpoint_s3_uri) == (
        "base", "ran on CPU: no GPU", "file:///fn-ck")
    assert spec.keep_alive_period_in_seconds == 30.0
    assert isinstance(spec.keep_alive_period_in_seconds, float)
    # and it is written back in the new shape, which reads back the same
    assert "extra" not in spec.to_json()
    assert JobSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_job_spec_from_json_ignores_unknown_fields() -> None:
    back = JobSpec.from_json({"name": "j", "added_in_a_later_version": 1})
    assert back == JobSpec(name=JobName("j"))


def test_job_spec_to_json_is_plain_json() -> None:
    data = _full_spec().to_json()
    assert data["tags"] == [["team", "ml"], ["cost", "low"]]
    assert data["kind"] == "script"
    json.dumps(data)


# --- instance types -----------------------------------------------------------------------

def test_m5_large() -> None:
    it = resolve_instance_type("ml.m5.large")
    assert (it.name, it.cpus, it.memory_gib, it.gpus) == ("ml.m5.large", 2, 8.0, 0)


def test_gpu_type() -> None:
    it = resolve_instance_type("ml.g5.xlarge")
    assert it.gpus == 1 and it.cpus == 4


def test_local_types() -> None:
    assert resolve_instance_type("local").gpus == 0
    assert resolve_instance_type("local_gpu").gpus == 1


@pytest.mark.parametrize("name", ["ml.m5.huge", "m5.large", "ml.nope.large", ""])
def test_unknown_instance_type(name: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        resolve_instance_type(name)
    assert repr(name) in str(info.value)
    assert info.value.details["instance_type"] == name


def test_unknown_size_suggests_the_family() -> None:
    with pytest.raises(InvalidArgumentError, match="ml.m5.large"):
        resolve_instance_type("ml.m5.huge")


def test_instance_table_is_consistent() -> None:
    for name, it in INSTANCE_TYPES.items():
        assert it.name == name and name.startswith("ml.")
        assert it.cpus > 0 and it.memory_gib > 0 and it.gpus >= 0


# --- job names ----------------------------------------------------------------------------

# SageMaker's TrainingJobName pattern.
SAGEMAKER_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_job_name_format() -> None:
    assert job_name_for("train", NOW, "abc123") == "train-250102-030405-abc123"


@pytest.mark.parametrize("base", [
    "train", "My_Fancy Function!", "x" * 200, "__", "", "a-" * 40, "-lead-and-trail-",
    "ünïcödé", "a" * 41 + "-b", "a--b", "-" * 60 + "x", "divide.<locals>.inner",
])
def test_job_name_is_sanitised_and_short(base: str) -> None:
    name = job_name_for(base, NOW, "abc123")
    assert len(name) <= 63
    assert SAGEMAKER_NAME.match(name), name
    assert re.fullmatch(r"[a-z0-9-]+", name), name
    assert "--" not in name, name
    assert name.endswith("-250102-030405-abc123")


def test_job_name_of_nothing_is_job() -> None:
    assert job_name_for("!!!", NOW, "abc123") == "job-250102-030405-abc123"


def test_random_id_factory_makes_distinct_names() -> None:
    ids = RandomIdFactory()
    names = {ids.job_name("f", NOW) for _ in range(50)}
    assert len(names) == 50
    assert all(len(n) <= 63 and n.startswith("f-250102-030405-") for n in names)
