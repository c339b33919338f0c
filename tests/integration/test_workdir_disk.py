"""A job's large argument and result stay on disk once, in the store: the work directory's
copies go when the job ends, and ``shoal jobs describe`` says what the job keeps (issue #15,
item 10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shoal import remote
from shoal.core import JobQuery

MB = 1024 * 1024


def files_over(path, size: int) -> list[str]:
    return [os.path.join(root, f) for root, _, files in os.walk(path) for f in files
            if os.path.getsize(os.path.join(root, f)) >= size]


def describe(home, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(home), "jobs",
                           "describe", name, *args], capture_output=True, text=True,
                          timeout=120, check=True)


def test_a_20_mb_argument_leaves_no_copy_in_the_work_directory(session):
    @remote
    def checksum_and_echo(blob: bytes) -> bytes:
        import hashlib

        with open("left-by-the-job.txt", "w") as f:  # the job's own file: it stays
            f.write(hashlib.sha256(blob).hexdigest())
        return blob[::-1]

    blob = os.urandom(20 * MB)
    assert checksum_and_echo(blob) == blob[::-1]
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="checksum-and-echo-"))
    workdir = session.home / "work" / f"{record.name}.1"
    assert workdir.is_dir()
    assert files_over(session.home / "work", MB) == []  # neither argument nor result copied
    assert (workdir / "left-by-the-job.txt").exists()
    stored = files_over(session.home / "artifacts" / record.name, 20 * MB)
    assert sorted(os.path.basename(os.path.dirname(p)) for p in stored) == \
        ["arguments", "results"]  # the stored artifacts remain

    data = json.loads(describe(session.home, record.name, "--json").stdout)["disk"]
    artifacts = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in
                    os.walk(session.home / "artifacts" / record.name) for f in files)
    assert data["artifact_bytes"] == artifacts > 40 * MB
    assert 0 < data["workdir_bytes"] < MB
    # The function's small pickle sits in the database (jobs/_payloads.py), counted too.
    function = session.jobs.get_payload(record.name, "function")
    assert data["database_bytes"] == len(function.data) + len(function.metadata) > 0
    assert data["total_bytes"] == (data["artifact_bytes"] + data["database_bytes"]
                                   + data["workdir_bytes"])
    text = describe(session.home, record.name).stdout
    assert "On disk" in text and f"({artifacts} bytes)" in text
