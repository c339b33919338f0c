"""Decompression bombs against deploy, training and bundles, and what ``endpoints delete``
leaves behind: real archives of zeros that expand past a cap lowered for the test, real
supervisors, real model servers.
"""

from __future__ import annotations

import io
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal
from helpers import endpoint_test_session, wait_until
from shoal.core.endpoints import EndpointStatus
from shoal.core.jobs import FailureKind, JobStatus
from shoal.endpoints import EndpointService
from shoal.errors import EndpointFailedError, InvalidArgumentError, JobFailedError
from shoal.estimator import Estimator
from shoal.model import Model

MIB = 2**20
CAP = 2 * MIB

HANDLER = """
def model_fn(model_dir):
    return open(model_dir + "/weights.bin", "rb").read()

def predict_fn(data, model):
    return {"bytes": len(model), "n": len(data)}
"""


@pytest.fixture
def session(tmp_path: Path) -> Iterator[shoal.Session]:
    s = shoal.Session(home=str(tmp_path / "home"), launcher_idle_seconds=60,
                      max_extract_bytes=CAP, max_extract_files=50)
    with endpoint_test_session(s, local=True):
        yield s


def _model_tar(path: Path, weights: int, *, files: int = 0) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("weights.bin")
        info.size = weights
        tar.addfile(info, io.BytesIO(bytes(weights)))
        for i in range(files):
            tar.addfile(tarfile.TarInfo(f"extra/f{i}.txt"), io.BytesIO(b""))
    return path


def _code(tmp_path: Path) -> Path:
    src = tmp_path / "code"
    src.mkdir(exist_ok=True)
    (src / "serve.py").write_text(textwrap.dedent(HANDLER))
    return src


def endpoint_dir(home: Path, name: str) -> Path:
    """Where the endpoint's supervisor stages its model (what deploy writes on this machine)."""
    return Path(home) / "endpoints" / name


def _bytes_under(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def test_a_model_bomb_fails_the_deploy_naming_archive_and_cap_and_delete_leaves_nothing(
        session, tmp_path):
    bomb = _model_tar(tmp_path / "model.tar.gz", 64 * MIB)
    assert bomb.stat().st_size < 200_000
    model = Model(model_data=str(bomb), entry_point="serve.py", source_dir=str(_code(tmp_path)))
    with pytest.raises(EndpointFailedError) as info:
        model.deploy(endpoint_name="bomb")
    text = str(info.value)
    assert str(bomb) in text and "2.0 MiB" in text and "SHOAL_MAX_EXTRACT_BYTES" in text
    record = EndpointService.for_session(session).get("bomb")
    assert record.status == EndpointStatus.FAILED
    assert "expands to more than 2.0 MiB" in record.failure_reason
    assert "supervisor" not in record.failure_reason  # the real reason, not 'supervisor gone'
    where = endpoint_dir(session.home, "bomb")
    assert _bytes_under(where) < CAP  # stopped at the cap; the partial extraction is gone
    assert not (where / "model").exists()
    EndpointService.for_session(session).delete("bomb")
    assert session.metadata.find_endpoint("bomb") is None
    assert not where.exists()
    assert session.artifacts.list_keys("endpoints/bomb/code") == []


def test_too_many_files_in_model_data_fail_the_deploy(session, tmp_path):
    many = _model_tar(tmp_path / "many.tar.gz", 10, files=60)
    with pytest.raises(EndpointFailedError, match="more than 50 files.*SHOAL_MAX_EXTRACT_FILES"):
        Model(model_data=str(many), entry_point="serve.py",
              source_dir=str(_code(tmp_path))).deploy(endpoint_name="many")
    where = endpoint_dir(session.home, "many")
    assert not (where / "model").exists()
    EndpointService.for_session(session).delete("many")
    assert not where.exists()


def test_delete_after_a_successful_deploy_removes_what_deploy_wrote(session, tmp_path):
    archive = _model_tar(tmp_path / "model.tar.gz", CAP // 2)
    predictor = Model(model_data=str(archive), entry_point="serve.py",
                      source_dir=str(_code(tmp_path))).deploy(endpoint_name="fine")
    assert predictor.predict([[1.0]]) == {"bytes": CAP // 2, "n": 1}
    where = endpoint_dir(session.home, "fine")
    assert (where / "model" / "weights.bin").stat().st_size == CAP // 2
    assert (where / "model" / "code" / "serve.py").exists()
    assert session.artifacts.list_keys("endpoints/fine/code")
    predictor.delete_endpoint()
    # delete returns once the record is gone, and the files go before the record does
    assert session.metadata.find_endpoint("fine") is None
    assert not where.exists()
    assert session.artifacts.list_keys("endpoints/fine/code") == []
    # the instances' logs stay in the store, as SageMaker's CloudWatch logs do
    wait_until(lambda: session.artifacts.list_keys("endpoints/fine/logs"), 30,
               what="the instance's log in the store")


def test_a_failed_deploy_frees_its_staged_model_and_delete_removes_the_rest(session, tmp_path):
    src = _code(tmp_path)
    (src / "serve.py").write_text("def model_fn(model_dir):\n    raise RuntimeError('nope')\n")
    archive = _model_tar(tmp_path / "model.tar.gz", CAP // 2)
    with pytest.raises(EndpointFailedError, match="nope"):
        Model(model_data=str(archive), entry_point="serve.py", source_dir=str(src)).deploy(
            endpoint_name="broken")
    where = endpoint_dir(session.home, "broken")
    assert not (where / "model").exists() and not (where / "code.tar.gz").exists()
    EndpointService.for_session(session).delete("broken")
    assert not where.exists()


def test_a_training_source_that_expands_past_the_cap_fails_the_job_with_the_reason(
        session, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('never runs')\n")
    (src / "zeros.bin").write_bytes(bytes(8 * MIB))  # packed by the client to a few kB
    est = Estimator(entry_point="train.py", source_dir=str(src))
    with pytest.raises(JobFailedError, match="SHOAL_MAX_EXTRACT_BYTES"):
        est.fit(logs=False)
    record = session.jobs.get(est.latest_training_job.name)
    assert record.status == JobStatus.FAILED
    assert record.failure_kind == FailureKind.ENVIRONMENT
    assert "the job's source" in record.failure_reason
    assert "expands to more than 2.0 MiB" in record.failure_reason
    work = Path(session.home) / "work"
    assert _bytes_under(work) < CAP
    assert not [p for p in work.rglob("*") if "extracting" in p.name]


def test_a_bundle_from_a_model_bomb_is_refused(session, tmp_path):
    from shoal.bundles import build_bundle

    bomb = _model_tar(tmp_path / "model.tar.gz", 64 * MIB)
    with pytest.raises(InvalidArgumentError, match="SHOAL_MAX_EXTRACT_BYTES") as info:
        build_bundle(str(bomb), target="container", output=str(tmp_path / "out"),
                     session=session)
    assert "model.tar.gz" in str(info.value)


def test_verifying_a_bundle_zip_bomb_is_refused_before_anything_runs(session, tmp_path):
    import zipfile

    from shoal.bundles import verify_bundle

    bomb = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model/model.onnx", bytes(64 * MIB))
    with pytest.raises(InvalidArgumentError, match=f"the bundle {bomb}.*2.0 MiB"):
        verify_bundle(bomb, session=session)
