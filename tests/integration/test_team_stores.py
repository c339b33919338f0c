"""The same jobs on the team setup: PostgreSQL metadata and an S3-compatible artifact store.

The supervisor reaches both through URLs in its environment, as a job on another machine
would; nothing goes through the client's local files.
"""

from __future__ import annotations

import pytest

import shoal
from shoal import remote
from shoal.core import JobQuery, JobStatus
from shoal.storage.sql import upgrade_schema

pytestmark = [pytest.mark.postgres, pytest.mark.s3]


def test_remote_job_on_postgres_and_s3(tmp_path, postgres_url, s3_bucket_url, moto_server,
                                       monkeypatch):
    url, _options = s3_bucket_url
    # botocore reads the endpoint from the environment, which the supervisor inherits.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_server)
    upgrade_schema(postgres_url)
    s = shoal.Session(home=str(tmp_path / "home"), metadata_url=postgres_url, artifact_url=url)
    try:
        @remote(sagemaker_session=s, job_name_prefix="team-job")
        def hello(name):
            print("hello from the job")
            return f"hello {name}"

        assert hello("team") == "hello team"
        records = s.metadata.list_jobs(JobQuery(name_prefix="team-job"))
        assert records and records[0].status == JobStatus.COMPLETED
        name = records[0].name
        # A small result is a row of the team's database; a large one an object in S3.
        assert s.metadata.get_job_payload(name, "results") is not None
        assert not s.artifacts.exists(f"{name}/results/payload.pkl")
        big = remote(sagemaker_session=s, job_name_prefix="team-big")(lambda n: b"x" * n)
        assert big(64 * 1024) == b"x" * 64 * 1024
        [large] = s.metadata.list_jobs(JobQuery(name_prefix="team-big"))
        assert s.artifacts.exists(f"{large.name}/results/payload.pkl")
        assert s.metadata.get_job_payload(large.name, "results") is None
        assert b"hello from the job" in s.jobs.read_log(name)
        with pytest.raises(ZeroDivisionError):
            remote(sagemaker_session=s)(lambda: 1 / 0)()
    finally:
        s.backend.shutdown_launcher()
        s.close()
