"""The team server's store routes refusing bad input, and streaming what is large: an upload
past the size limit is a 413 before anything is stored (declared, or counted as it comes), a
key that climbs out of the store is a 400 naming it, and a file of many MB goes up and comes
back byte for byte without being held whole in memory (real server processes, real HTTP)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import tracemalloc
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from helpers import wait_until
from shoal.client import HttpArtifactStore, HttpEndpointStore, HttpJobStore
from shoal.core import JobName, JobSpec, JobStatus
from shoal.core.endpoints import EndpointConfig
from shoal.errors import InvalidArtifactKeyError, PayloadTooLargeError, PermissionDeniedError

LIMIT = 1024 * 1024


def test_the_openapi_document_lists_the_job_endpoint_and_artifact_routes(shoal_server) -> None:
    with httpx.Client(base_url=shoal_server.url) as client:
        paths = set(client.get("/api/v1/openapi.json").json()["paths"])
    assert {"/api/v1/jobs", "/api/v1/jobs/{name}", "/api/v1/jobs/{name}/transitions",
            "/api/v1/job-transitions", "/api/v1/endpoints/{name}", "/api/v1/artifacts",
            "/api/v1/artifacts/keys"} <= paths


def test_a_read_token_reads_jobs_endpoints_and_artifacts_and_cannot_change_them(
        shoal_server, tmp_path: Path) -> None:
    made = shoal_server.cli("tokens", "create", "--user", "erin", "--name", "stores-reader",
                            "--create-user")
    assert made.returncode == 0, made.stderr
    reader_token = made.stdout.strip()
    name = JobName(f"read-only-{os.getpid()}")
    with HttpJobStore.open(shoal_server.url, shoal_server.admin_token) as admin_jobs, \
            HttpJobStore.open(shoal_server.url, reader_token) as jobs, \
            HttpEndpointStore.open(shoal_server.url, reader_token) as endpoints, \
            HttpArtifactStore.open(shoal_server.url, reader_token) as artifacts:
        admin_jobs.create_job(JobSpec(name=name), key_salt="s", backend="local")
        assert jobs.get_job(name).status is JobStatus.PENDING
        with pytest.raises(PermissionDeniedError, match="update_job"):
            jobs.update_job(name, status=JobStatus.STOPPED)
        assert admin_jobs.get_job(name).status is JobStatus.PENDING  # nothing changed
        with pytest.raises(PermissionDeniedError, match="create_endpoint"):
            endpoints.create_endpoint(f"ep-{os.getpid()}", model_data="m",
                                      config=EndpointConfig())
        assert endpoints.find_endpoint(f"ep-{os.getpid()}") is None
        with pytest.raises(PermissionDeniedError, match="put_artifact"):
            artifacts.put_bytes("read-only/x", b"x")
        assert not artifacts.exists("read-only/x")
        admin_jobs.update_job(name, status=JobStatus.STOPPED)
        assert admin_jobs.delete_jobs([name]) == [name]


def _put(url: str, key: str, *, length: int | None, chunks: list[bytes]) -> tuple[int, dict]:
    """A raw ``PUT /api/v1/artifacts?key=`` (no client-side checks): a declared *length*
    with no body sent, or *chunks* sent chunked; the server's status and JSON."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.putrequest("PUT", f"/api/v1/artifacts?key={key}")
        if length is not None:
            conn.putheader("Content-Length", str(length))
        else:
            conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        for chunk in chunks:  # never the closing chunk: the server must answer without it
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def small(own_shoal_server) -> tuple[str, Path]:
    """A server (no auth, loopback) that takes uploads of at most 1 MiB."""
    _, url, home = own_shoal_server("--no-auth",
                                    env={"SHOAL_SERVER_MAX_UPLOAD_BYTES": str(LIMIT)})
    return url, home


def test_an_upload_past_the_limit_is_413_and_leaves_nothing_on_the_servers_disk(
        small: tuple[str, Path], tmp_path: Path) -> None:
    url, home = small
    store = HttpArtifactStore.open(url, None)
    try:
        store.put_bytes("j/exact", b"x" * LIMIT)  # the limit itself is allowed
        assert store.get_bytes("j/exact") == b"x" * LIMIT
        # Declared too large: refused from the header, before a byte of the body.
        status, body = _put(url, "j/declared", length=LIMIT + 1, chunks=[])
        assert status == 413 and body["error"]["code"] == "PAYLOAD_TOO_LARGE"
        assert "'j/declared'" in body["error"]["message"]
        assert "SHOAL_SERVER_MAX_UPLOAD_BYTES" in body["error"]["message"]
        # Sent without a length: refused as the count passes the limit.
        status, body = _put(url, "j/counted", length=None,
                            chunks=[b"y" * (256 * 1024)] * 5)
        assert status == 413 and body["error"]["details"]["limit"] == LIMIT
        # The client refuses before sending, naming the key and the limit.
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(LIMIT + 1))
        with pytest.raises(PayloadTooLargeError, match=rf"'j/big'.*{LIMIT}"):
            store.put_file("j/big", big)
        for key in ("j/declared", "j/counted", "j/big"):
            assert not store.exists(key)
        assert store.list_keys("j") == ["j/exact"]
    finally:
        store.close()
    assert _files_under(home / "artifacts") == ["j/exact"]
    assert _files_under(home / "uploads") == []  # no spooled part left behind


def test_an_upload_cut_off_midway_stores_nothing_and_leaves_no_spooled_part(
        small: tuple[str, Path]) -> None:
    url, home = small
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.putrequest("PUT", "/api/v1/artifacts?key=j/cut")
    conn.putheader("Content-Length", str(LIMIT))
    conn.endheaders()
    conn.send(b"z" * (LIMIT // 2))
    wait_until(lambda: _files_under(home / "uploads"), 30,
               what="the server to spool the first half")
    conn.close()  # the client goes away with half of its body sent
    wait_until(lambda: _files_under(home / "uploads") == [], 30,
               what="the server to drop the spooled half")
    with HttpArtifactStore.open(url, None) as store:
        assert not store.exists("j/cut") and store.list_keys("j") == []
    assert _files_under(home / "artifacts") == []


@pytest.mark.parametrize("key", ["../outside", "j/../../etc/passwd", "/etc/passwd"])
def test_a_key_outside_the_store_is_400_naming_it(shoal_server, key: str) -> None:
    headers = {"Authorization": f"Bearer {shoal_server.admin_token}"}
    with httpx.Client(base_url=shoal_server.url, headers=headers) as raw:
        for method, path, params in (("PUT", "/api/v1/artifacts", {"key": key}),
                                     ("GET", "/api/v1/artifacts", {"key": key}),
                                     ("GET", "/api/v1/artifacts/keys", {"prefix": key}),
                                     ("DELETE", "/api/v1/artifacts", {"prefix": key})):
            response = raw.request(method, path, params=params, content=b"x"
                                   if method == "PUT" else None)
            assert response.status_code == 400, (method, path, response.text)
            error = response.json()["error"]
            assert error["code"] == "INVALID_ARTIFACT_KEY" and repr(key) in error["message"]
    store = HttpArtifactStore.open(shoal_server.url, shoal_server.admin_token)
    try:
        with pytest.raises(InvalidArtifactKeyError, match=repr(key)):
            store.put_bytes(key, b"x")
    finally:
        store.close()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def test_a_large_file_streams_up_and_down_byte_exact(own_shoal_server, tmp_path: Path) -> None:
    proc, url, home = own_shoal_server("--no-auth")
    size = 48 * 1024 * 1024 + 7
    source = tmp_path / "model.tar.gz"
    with open(source, "wb") as f:
        for _ in range(size // (1024 * 1024)):
            f.write(os.urandom(1024 * 1024))
        f.write(os.urandom(size % (1024 * 1024)))
    store = HttpArtifactStore.open(url, None)
    try:
        store.put_bytes("warm/up", b"1")  # the server's first request imports what it needs
        before = _peak_rss_kib(proc.pid)
        tracemalloc.start()
        try:
            store.put_file("big/model.tar.gz", source)
            store.get_file("big/model.tar.gz", tmp_path / "back.tar.gz")
            _, client_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        server_growth_kib = _peak_rss_kib(proc.pid) - before
        assert store.disk_usage("big") == size
    finally:
        store.close()
    assert _sha256(tmp_path / "back.tar.gz") == _sha256(source)
    assert (home / "artifacts" / "big" / "model.tar.gz").stat().st_size == size
    # Streamed: neither side held the file whole (chunks of 1 MiB, a few at a time).
    assert client_peak < size // 4, client_peak
    assert server_growth_kib * 1024 < size // 2, server_growth_kib


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")
