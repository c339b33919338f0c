"""One contract suite for every ArtifactStore: memory://, file://, s3:// (moto), and the
server's store through a real ``shoal server`` process (``HttpArtifactStore`` over HTTP)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.client import HttpArtifactStore
from shoal.core import ArtifactStore
from shoal.errors import ArtifactNotFound, ArtifactStoreError
from shoal.storage import FsspecArtifactStore, job_key

#: The top-level prefixes this suite writes: a worker's tests share one server's store, so
#: each test starts (and leaves) them empty there.
_PREFIXES = ("j", "job-1", "job-10", "job-2", "job-20", "job-3", "nope", "never-written")


@pytest.fixture(params=["memory", "file", pytest.param("s3", marks=pytest.mark.s3), "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ArtifactStore]:
    kind = request.param
    if kind == "server":
        server = request.getfixturevalue("shoal_server")
        http = HttpArtifactStore.open(server.url, server.admin_token)
        try:
            for prefix in _PREFIXES:
                http.delete_prefix(prefix)
            yield http
            for prefix in _PREFIXES:
                http.delete_prefix(prefix)
        finally:
            http.close()
    elif kind == "memory":
        url = f"memory://shoal-test-{uuid.uuid4().hex}"
        st = FsspecArtifactStore.open(url)
        yield st
        root = st._fs._strip_protocol(url)  # memory:// is process-wide: clean up
        if st._fs.exists(root):
            st._fs.rm(root, recursive=True)
    elif kind == "file":
        yield FsspecArtifactStore.open(f"file://{tmp_path / 'artifacts'}")
    else:
        pytest.importorskip("s3fs")
        url, options = request.getfixturevalue("s3_bucket_url")
        yield FsspecArtifactStore.open(url, options)


def test_is_an_artifact_store(store: ArtifactStore) -> None:
    assert isinstance(store, ArtifactStore)


def test_uri_and_root(store: ArtifactStore) -> None:
    assert store.uri("job-1/function/payload.pkl") == f"{store.root}/job-1/function/payload.pkl"
    assert "://" in store.root


def test_put_get_round_trip(store: ArtifactStore) -> None:
    key = job_key("job-1", "function", "payload.pkl")
    assert key == "job-1/function/payload.pkl"
    store.put_bytes(key, b"hello")
    assert store.get_bytes(key) == b"hello"


def test_empty_value(store: ArtifactStore) -> None:
    store.put_bytes("j/empty", b"")
    assert store.get_bytes("j/empty") == b""
    assert store.exists("j/empty")


def test_overwrite(store: ArtifactStore) -> None:
    store.put_bytes("j/k", b"first version, longer")
    assert store.get_bytes("j/k") == b"first version, longer"
    store.put_bytes("j/k", b"second")
    assert store.get_bytes("j/k") == b"second"
    assert store.read_range("j/k", 3) == b"ond"


def test_overwrite_after_listing(store: ArtifactStore) -> None:
    """Listing must not leave a stale size or existence behind (fsspec listings caches)."""
    store.put_bytes("j/log", b"abc")
    assert store.list_keys("j") == ["j/log"]
    assert store.read_range("j/log", 1) == b"bc"
    store.put_bytes("j/log", b"abcdef")
    assert store.read_range("j/log", 3) == b"def"
    store.put_bytes("j/other", b"x")
    assert store.list_keys("j") == ["j/log", "j/other"]
    assert store.exists("j/other")


def test_read_range(store: ArtifactStore) -> None:
    store.put_bytes("j/logs/stdout", b"0123456789")
    assert store.read_range("j/logs/stdout", 0) == b"0123456789"
    assert store.read_range("j/logs/stdout", 4) == b"456789"
    assert store.read_range("j/logs/stdout", 9) == b"9"
    assert store.read_range("j/logs/stdout", 10) == b""
    assert store.read_range("j/logs/stdout", 1000) == b""


def test_missing_key(store: ArtifactStore) -> None:
    with pytest.raises(ArtifactNotFound) as info:
        store.get_bytes("nope/payload.pkl")
    assert store.uri("nope/payload.pkl") in str(info.value)
    assert info.value.details["key"] == "nope/payload.pkl"
    with pytest.raises(ArtifactNotFound):
        store.read_range("nope/payload.pkl", 5)


def test_exists(store: ArtifactStore) -> None:
    assert not store.exists("j/a")
    store.put_bytes("j/a", b"1")
    assert store.exists("j/a")
    assert not store.exists("j/b")


def test_list_keys(store: ArtifactStore) -> None:
    for key in ("job-2/function/payload.pkl", "job-2/function/metadata.json",
                "job-2/results/payload.pkl", "job-20/function/payload.pkl",
                "job-3/function/payload.pkl"):
        store.put_bytes(key, key.encode())
    assert store.list_keys("job-2") == ["job-2/function/metadata.json",
                                        "job-2/function/payload.pkl",
                                        "job-2/results/payload.pkl"]
    assert store.list_keys("job-2/results") == ["job-2/results/payload.pkl"]
    assert store.list_keys("job-9") == []


def test_delete_prefix(store: ArtifactStore) -> None:
    store.put_bytes("job-1/function/payload.pkl", b"a")
    store.put_bytes("job-1/results/payload.pkl", b"b")
    store.put_bytes("job-10/function/payload.pkl", b"c")
    assert store.list_keys("job-1") == ["job-1/function/payload.pkl",
                                        "job-1/results/payload.pkl"]
    store.delete_prefix("job-1")
    assert not store.exists("job-1/function/payload.pkl")
    assert store.list_keys("job-1") == []
    assert store.get_bytes("job-10/function/payload.pkl") == b"c"
    store.delete_prefix("job-1")  # deleting nothing is fine
    store.delete_prefix("never-written")


@pytest.mark.parametrize("key", ["", "..", "../x", "a/../../x", "/etc/passwd", "a/../b"])
def test_invalid_keys(store: ArtifactStore, key: str) -> None:
    for call in (lambda: store.put_bytes(key, b"x"), lambda: store.get_bytes(key),
                 lambda: store.read_range(key, 0), lambda: store.exists(key),
                 lambda: store.list_keys(key), lambda: store.delete_prefix(key)):
        with pytest.raises(ArtifactStoreError):
            call()


def test_all_byte_values(store: ArtifactStore) -> None:
    data = bytes(range(256)) * 4 + b"\r\n\r\x00"
    store.put_bytes("j/binary", data)
    assert store.get_bytes("j/binary") == data
    assert store.read_range("j/binary", 255) == data[255:]


def test_larger_value(store: ArtifactStore) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    store.put_bytes("j/big", data)
    assert store.get_bytes("j/big") == data
    assert store.read_range("j/big", 2 * 1024 * 1024) == data[2 * 1024 * 1024:]


def test_invalid_keys_name_the_key(store: ArtifactStore) -> None:
    with pytest.raises(ArtifactStoreError, match=r"'a/\.\./b'") as info:
        store.put_bytes("a/../b", b"x")
    assert info.value.details["key"] == "a/../b"


def test_disk_usage(store: ArtifactStore) -> None:
    assert store.disk_usage("j") == 0
    store.put_bytes("j/a", b"12345")
    store.put_bytes("j/sub/b", b"123")
    assert store.disk_usage("j") == 8
    assert store.disk_usage("j/sub") == 3


def test_put_file_and_get_file_round_trip(store: ArtifactStore, tmp_path: Path) -> None:
    data = os.urandom(2 * 1024 * 1024 + 5)
    (tmp_path / "up.bin").write_bytes(data)
    store.put_file("j/up.bin", tmp_path / "up.bin")
    store.get_file("j/up.bin", tmp_path / "down.bin")
    assert (tmp_path / "down.bin").read_bytes() == data
    with pytest.raises(ArtifactNotFound):
        store.get_file("j/missing.bin", tmp_path / "none.bin")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["down.bin", "up.bin"]


def test_unsupported_url() -> None:
    with pytest.raises(ArtifactStoreError, match="nosuchproto"):
        FsspecArtifactStore.open("nosuchproto://x/y")


# --- file:// specifics --------------------------------------------------------------------

@pytest.fixture
def file_store(tmp_path: Path) -> FsspecArtifactStore:
    return FsspecArtifactStore.open(f"file://{tmp_path / 'artifacts'}")


def test_local_path(file_store: ArtifactStore, tmp_path: Path) -> None:
    file_store.put_bytes("j/a", b"1")
    assert file_store.local_path("j/a") == str(tmp_path / "artifacts" / "j" / "a")
    assert (tmp_path / "artifacts" / "j" / "a").read_bytes() == b"1"


def test_no_temporary_files_are_left(file_store: ArtifactStore, tmp_path: Path) -> None:
    for i in range(20):
        file_store.put_bytes("j/a", str(i).encode())
        file_store.put_bytes(f"j/n{i}", b"x")
    names = sorted(p.name for p in (tmp_path / "artifacts" / "j").iterdir())
    assert names == sorted(["a", *(f"n{i}" for i in range(20))])


def test_failed_write_leaves_no_temporary_file(file_store: ArtifactStore,
                                               tmp_path: Path) -> None:
    (tmp_path / "artifacts" / "j" / "dir").mkdir(parents=True)
    with pytest.raises(ArtifactStoreError):
        file_store.put_bytes("j/dir", b"cannot replace a directory")
    assert [p.name for p in (tmp_path / "artifacts" / "j").iterdir()] == ["dir"]


def test_concurrent_reader_never_sees_a_partial_file(file_store: ArtifactStore) -> None:
    size = 8 * 1024 * 1024
    values = [bytes([i]) * size for i in range(4)]
    file_store.put_bytes("j/payload.pkl", values[0])
    stop = threading.Event()
    errors: list[BaseException] = []
    writes = 0

    def writer() -> None:
        nonlocal writes
        try:
            while not stop.is_set():
                file_store.put_bytes("j/payload.pkl", values[writes % len(values)])
                writes += 1
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        seen = set()
        for _ in range(60):
            data = file_store.get_bytes("j/payload.pkl")
            assert len(data) == size and data[0:1] * size == data, "partial or mixed read"
            seen.add(data[0])
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert not errors, errors
    assert writes > 1
    assert file_store.list_keys("j") == ["j/payload.pkl"]
