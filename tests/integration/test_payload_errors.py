"""Results that cannot be read say who cannot read them and why: real jobs under real
supervisors, whose code patches json or returns what only the job can import."""

from __future__ import annotations

import pytest

from shoal import remote
from shoal.errors import PayloadIntegrityError, SerializationError

ONLY_IN_THE_JOB = "class Point:\n    def __init__(self, x):\n        self.x = x\n"


@remote
def patches_json(value):
    import json

    class Hostile(json.JSONEncoder):
        def encode(self, o):
            return "not json {"

    json.JSONEncoder = Hostile
    json.encoder.JSONEncoder.encode = lambda self, o: "garbage"
    json.dumps = lambda *a, **k: "garbage"
    json.loads = lambda *a, **k: {}
    return {"value": value, "encoded": json.dumps({"a": 1})}


def returns_a_job_only_class(directory):
    import importlib
    import pathlib
    import sys

    pathlib.Path(directory, "jobonly_points.py").write_text(ONLY_IN_THE_JOB)
    sys.path.insert(0, directory)
    return importlib.import_module("jobonly_points").Point(3)


def answer():
    return 42


def _run(session, func, *args):
    from shoal.remote_function import RemoteOptions

    svc = session.jobs
    record = svc.submit_function(RemoteOptions().build_spec(func, session), func, args, {})
    return svc, svc.wait(record.name, timeout=120)


def test_a_job_that_patches_json_keeps_its_result(session):
    # Before: the result's metadata.json was "garbage" and the client refused the result.
    assert patches_json(7) == {"value": 7, "encoded": "garbage"}
    assert patches_json(8)["value"] == 8


def test_a_result_the_client_cannot_import_blames_the_client_and_names_module_and_class(
        session, tmp_path):
    job_dir = tmp_path / "job-only"
    job_dir.mkdir()
    svc, final = _run(session, returns_a_job_only_class, str(job_dir))
    with pytest.raises(SerializationError) as info:
        svc.outcome(final)
    text = str(info.value)
    assert f"result of job {final.name}" in text
    assert "This client" in text and "cannot import module 'jobonly_points'" in text
    assert "jobonly_points.Point" in text and "client's environment" in text
    assert "in the job's environment" not in text
    assert info.value.details["reader"] == "client"


def test_unreadable_result_metadata_is_not_called_tampering(session):
    svc, final = _run(session, answer)
    assert svc.outcome(final) == 42
    data, _meta = session.metadata.get_job_payload(final.name, "results")  # a small payload
    session.metadata.put_job_payloads(final.name, {"results": (data, b'{"format_')})
    with pytest.raises(SerializationError) as info:
        svc.outcome(final)
    assert not isinstance(info.value, PayloadIntegrityError)
    text = str(info.value)
    assert final.name in text and "metadata.json" in text and "unreadable" in text
