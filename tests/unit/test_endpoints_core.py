"""Endpoint types and the client-side checks of Model: everything refused before anything
starts, and the code shipped as the model's ``code/``."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

import shoal
from shoal.core.endpoints import (
    ENDPOINT_TRANSITIONS,
    BatchingOptions,
    EndpointConfig,
    EndpointStatus,
    check_endpoint_name,
    check_endpoint_transition,
)
from shoal.endpoints._staging import pack_code, stage_model
from shoal.errors import InvalidArgumentError, InvalidTransitionError, ServingError
from shoal.model import Model


@pytest.mark.parametrize("value", [
    {"max_batch_size": 0}, {"max_batch_size": "8"}, {"max_batch_size": True},
    {"max_batch_size": 8, "max_batch_delay_ms": -1},
    {"max_batch_size": 8, "max_batch_delay_ms": "5"},
    {"max_batch_size": 8, "max_delay": 5}, {}, [8, 5], "8",
])
def test_malformed_batching_is_refused_clearly(value):
    with pytest.raises(InvalidArgumentError, match="batching") as info:
        BatchingOptions.parse(value)
    assert info.value.details["argument"] == "batching"


def test_batching_parses_and_round_trips():
    options = BatchingOptions.parse({"max_batch_size": 16, "max_batch_delay_ms": 2})
    assert options == BatchingOptions(16, 2.0)
    assert BatchingOptions.parse(None) is None
    assert BatchingOptions.parse(options) is options
    config = EndpointConfig(instance_count=3, batching=options, env={"A": "b"}, port=9000,
                            code=True, entry_point="serve.py", requirements=True)
    assert EndpointConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("kwargs, argument", [
    ({"instance_count": 0}, "initial_instance_count"),
    ({"instance_count": 1.5}, "initial_instance_count"),
    ({"port": 0}, "port"), ({"port": 65535, "instance_count": 2}, "port"),
    ({"env": {"A": 1}}, "env"),
    ({"startup_timeout_s": 0}, "container_startup_health_check_timeout"),
])
def test_config_checks(kwargs, argument):
    with pytest.raises(InvalidArgumentError) as info:
        EndpointConfig(**kwargs)
    assert info.value.details["argument"] == argument


def test_names_and_transitions():
    assert check_endpoint_name("digits-1") == "digits-1"
    for bad in ("-x", "a_b", "a" * 64, "", 3):
        with pytest.raises(InvalidArgumentError, match="endpoint name"):
            check_endpoint_name(bad)
    assert set(ENDPOINT_TRANSITIONS) == set(EndpointStatus)
    assert ENDPOINT_TRANSITIONS[EndpointStatus.DELETING] == frozenset()
    check_endpoint_transition("e", EndpointStatus.CREATING, EndpointStatus.IN_SERVICE)
    with pytest.raises(InvalidTransitionError, match="'e' is Failed"):
        check_endpoint_transition("e", EndpointStatus.FAILED, EndpointStatus.IN_SERVICE)
    assert EndpointStatus.FAILED.is_settled and not EndpointStatus.CREATING.is_settled


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.onnx").write_bytes(b"onnx")
    return d


def test_model_refuses_what_cannot_work(tmp_path: Path, model_dir: Path):
    session = shoal.Session(home=str(tmp_path / "home"))
    with pytest.raises(InvalidArgumentError, match="model_data .*missing.* does not exist"):
        Model(model_data=str(tmp_path / "missing"), sagemaker_session=session)
    with pytest.raises(InvalidArgumentError, match="model_data is required"):
        Model(sagemaker_session=session)
    with pytest.raises(InvalidArgumentError, match="entry_point nope.py does not exist"):
        Model(model_data=model_dir, entry_point="nope.py", sagemaker_session=session)
    with pytest.raises(InvalidArgumentError, match="source_dir .* is not a directory"):
        Model(model_data=model_dir, source_dir=str(tmp_path / "nosrc"), sagemaker_session=session)
    with pytest.raises(InvalidArgumentError, match="dependencies file"):
        Model(model_data=model_dir, dependencies=str(tmp_path / "req.txt"), sagemaker_session=session)
    with pytest.raises(TypeError, match="colour"):
        Model(model_data=model_dir, sagemaker_session=session, colour="blue")
    model = Model(model_data=model_dir, sagemaker_session=session, vpc_config={"x": 1})
    with pytest.raises(TypeError, match="colour"):
        model.deploy(colour="blue")
    with pytest.raises(InvalidArgumentError, match="batching: max_batch_size"):
        model.deploy(batching={"max_batch_size": -1})
    with pytest.raises(InvalidArgumentError, match="unknown instance_type"):
        model.deploy(instance_type="ml.m5.huge")
    with pytest.raises(InvalidArgumentError, match="endpoint name"):
        model.deploy(endpoint_name="bad_name")
    with pytest.raises(InvalidArgumentError, match="initial_instance_count"):
        model.deploy(initial_instance_count=0)
    # Nothing was created by the refused calls.
    assert session.metadata.list_endpoints() == []
    session.close()


def test_code_is_packed_as_code_dir_with_inference_py(tmp_path: Path, model_dir: Path):
    src = tmp_path / "src"
    (src / "__pycache__").mkdir(parents=True)
    (src / "serve.py").write_text("def model_fn(d):\n    return 1\n")
    (src / "helper.py").write_text("X = 1\n")
    (src / "__pycache__" / "x.pyc").write_bytes(b"")
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "__init__.py").write_text("")
    archive = tmp_path / "code.tar.gz"
    pack_code(archive, entry_point="serve.py", source_dir=src, dependencies=[lib])
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
    assert names == ["helper.py", "inference.py", "mylib", "mylib/__init__.py",
                     "serve.py"]
    staged = stage_model(str(model_dir), tmp_path / "staged", code_archive=archive)
    assert (staged / "model.onnx").read_bytes() == b"onnx"
    assert (staged / "code" / "inference.py").read_text() == (src / "serve.py").read_text()
    assert (staged / "code" / "mylib" / "__init__.py").exists()
    assert (model_dir / "code").exists() is False  # the original directory is untouched


def test_stage_model_from_archives_and_files(tmp_path: Path, model_dir: Path):
    # A local directory without added code is served as it is.
    assert stage_model(str(model_dir), tmp_path / "a", code_archive=None) == model_dir
    tar_path = tmp_path / "model.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(model_dir / "model.onnx", arcname="model.onnx")
    staged = stage_model(tar_path.as_uri(), tmp_path / "b", code_archive=None)
    assert (staged / "model.onnx").read_bytes() == b"onnx"
    staged = stage_model(str(model_dir / "model.onnx"), tmp_path / "c", code_archive=None)
    assert sorted(p.name for p in staged.iterdir()) == ["model.onnx"]
    with pytest.raises(ServingError, match="does not exist"):
        stage_model(str(tmp_path / "gone"), tmp_path / "d", code_archive=None)
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        tar.addfile(info, None)
    with pytest.raises(ServingError, match="cannot unpack"):
        stage_model(str(evil), tmp_path / "e", code_archive=None)
    assert not (tmp_path / "escape.txt").exists()


def test_stage_model_from_an_fsspec_url(tmp_path: Path):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe(f"/models-{tmp_path.name}/m/model.onnx", b"onnx")
    staged = stage_model(f"memory://models-{tmp_path.name}/m", tmp_path / "s", code_archive=None)
    assert (staged / "model.onnx").read_bytes() == b"onnx"
    with pytest.raises(ServingError, match="does not exist"):
        stage_model(f"memory://models-{tmp_path.name}/nothing.tar.gz", tmp_path / "t",
                    code_archive=None)
