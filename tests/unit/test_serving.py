"""The model server's pieces without sockets: options, codecs, Accept, handler choice, the
queue's batching (driven by an event loop, no server)."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from shoal.errors import ConfigError, ModelLoadError
from shoal.serving import ServerOptions
from shoal.serving._batching import InferenceQueue
from shoal.serving._handlers import OnnxHandler, SklearnHandler, select_handler
from shoal.serving._options import DEFAULT_MAX_BATCH_SIZE
from shoal.serving.codecs import CSV, JSON, NPY, decode, encode, load_npy, media_type, negotiate
from shoal.serving.http import RequestError

# --- options ---------------------------------------------------------------------------------


def test_options_environment_is_overridden_by_explicit_values() -> None:
    env = {"SHOAL_MODEL_SERVER_WORKERS": "3", "SHOAL_MODEL_SERVER_TIMEOUT": "7.5",
           "SHOAL_MAX_BATCH_SIZE": "16", "SHOAL_MAX_BATCH_DELAY_MS": "4",
           "SHOAL_ORT_INTRA_OP_THREADS": "2", "UNRELATED": "x"}
    opts = ServerOptions.from_env(env)
    assert (opts.workers, opts.timeout_s, opts.max_batch_size, opts.max_batch_delay_ms,
            opts.intra_op_threads) == (3, 7.5, 16, 4.0, 2)
    assert ServerOptions.from_env(env, workers=1, max_batch_size=None).workers == 1
    assert ServerOptions.from_env({}) == ServerOptions()


def test_hostile_client_options_default_to_loopback_and_hide_the_key() -> None:
    opts = ServerOptions.from_env({"SHOAL_MODEL_SERVER_READ_TIMEOUT": "5",
                                   "SHOAL_MODEL_SERVER_MAX_CONNECTIONS": "64",
                                   "SHOAL_API_KEY": "from-env"})
    assert (opts.host, opts.read_timeout_s, opts.max_connections) == ("127.0.0.1", 5.0, 64)
    assert opts.api_key is None  # only the entry points read SHOAL_API_KEY
    keyed = ServerOptions(api_key="hunter2")
    assert keyed.api_key == "hunter2" and "hunter2" not in repr(keyed)


def test_workers_share_the_cpus_out_unless_threads_are_set() -> None:
    import os

    from shoal.serving._handlers import intra_op_threads

    cpus = len(os.sched_getaffinity(0))
    assert intra_op_threads(ServerOptions()) is None  # one worker: the runtime's default
    assert intra_op_threads(ServerOptions(workers=2)) == max(1, cpus // 2)
    assert intra_op_threads(ServerOptions(workers=cpus + 1)) == 1
    assert intra_op_threads(ServerOptions(workers=2, intra_op_threads=3)) == 3


def test_workers_default_to_one_per_usable_cpu() -> None:
    import os

    from shoal.serving._options import default_workers

    cpus = len(os.sched_getaffinity(0))
    assert ServerOptions().workers is None  # not asked for: serve() resolves it
    assert ServerOptions().worker_count == default_workers() == cpus
    assert ServerOptions(workers=3).worker_count == 3
    assert ServerOptions.from_env({"SHOAL_MODEL_SERVER_WORKERS": "1"}).worker_count == 1
    assert ServerOptions.from_env({"SHOAL_MODEL_SERVER_WORKERS": " "}).workers is None


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"max_batch_size": 0}, "max_batch_size must be >= 1, got 0"),
    ({"max_batch_size": -1}, "max_batch_size must be >= 1"),
    ({"max_batch_size": 2.5}, "max_batch_size must be an integer"),
    ({"max_batch_size": True}, "max_batch_size must be an integer"),
    ({"max_batch_delay_ms": 3}, "without max_batch_size"),
    ({"max_batch_size": 4, "max_batch_delay_ms": -1}, "max_batch_delay_ms must be >= 0"),
    ({"max_batch_size": 4, "max_batch_delay_ms": float("nan")}, "finite number"),
    ({"workers": 0}, "workers must be >= 1"),
    ({"port": 70000}, "port must be between 0 and 65535"),
    ({"timeout_s": 0}, "timeout_s must be > 0"),
    ({"max_payload_mb": -1}, "max_payload_mb must be > 0"),
    ({"max_queue": 0}, "max_queue must be >= 1"),
    ({"read_timeout_s": 0}, "read_timeout_s must be > 0"),
    ({"max_connections": 0}, "max_connections must be >= 1"),
    ({"api_key": "  "}, "api_key is blank"),
])
def test_malformed_options_are_refused(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ServerOptions(**kwargs)


def test_malformed_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="SHOAL_MAX_BATCH_SIZE='8x' is not an integer"):
        ServerOptions.from_env({"SHOAL_MAX_BATCH_SIZE": "8x"})


def test_batch_limits() -> None:
    assert ServerOptions().batch_limits(batchable=False) == (1, 0.0)
    assert ServerOptions().batch_limits(batchable=True) == (DEFAULT_MAX_BATCH_SIZE, 0.0)
    opts = ServerOptions(max_batch_size=8, max_batch_delay_ms=5)
    assert opts.batch_limits(batchable=True) == (8, 0.005)
    assert ServerOptions(max_batch_size=1).batch_limits(batchable=True) == (1, 0.0)


# --- codecs and Accept -----------------------------------------------------------------------

@pytest.mark.parametrize(("accept", "request_type", "want"), [
    (None, NPY, NPY), ("", CSV, CSV), ("*/*", JSON, JSON), ("*/*", "text/x-other", JSON),
    ("text/csv;q=0.1, application/json;q=0.9", NPY, JSON), ("text/*", JSON, CSV),
    ("application/*", NPY, NPY), ("image/png, */*;q=0.1", CSV, CSV),
    ("application/json;q=0, text/csv", JSON, CSV),
])
def test_negotiate(accept: str | None, request_type: str, want: str) -> None:
    assert negotiate(accept, request_type, (JSON, CSV, NPY)) == want


def test_negotiate_refuses_and_passes_through() -> None:
    with pytest.raises(RequestError) as info:
        negotiate("image/png, text/html", JSON, (JSON, CSV, NPY))
    assert info.value.status == 406
    assert negotiate("text/x-mine;q=0.5, */*", "text/plain", None) == "text/x-mine"
    assert negotiate("*/*", "text/plain", None) == "text/plain"


def test_media_type() -> None:
    assert media_type("Application/JSON; charset=utf-8") == JSON
    assert media_type(None) == JSON and media_type("") == JSON


def _npy(arr: np.ndarray, **kw: object) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, **kw)
    return buf.getvalue()


def test_npy_round_trip_and_the_header_cache() -> None:
    for arr in (np.arange(6, dtype=np.float32).reshape(2, 3), np.asfortranarray(
            np.arange(6.0).reshape(2, 3)), np.array([True, False]), np.arange(3, dtype=">i4")):
        for _ in range(2):  # the second load takes the cached-header path
            back = load_npy(_npy(arr))
            np.testing.assert_array_equal(back, arr)
            assert back.dtype == arr.dtype and back.flags.writeable
    out = np.ones((2, 3), np.float32)
    assert np.array_equal(np.load(io.BytesIO(encode(out, NPY))), out)
    assert np.array_equal(np.load(io.BytesIO(encode(out, NPY))), out)  # cached header


def test_npy_refuses_pickles_and_truncation() -> None:
    with pytest.raises(RequestError, match="pickled objects are never loaded"):
        load_npy(_npy(np.array([{"a": 1}], dtype=object), allow_pickle=True))
    body = _npy(np.ones((4, 4), np.float32))
    load_npy(body)
    with pytest.raises(RequestError, match="truncated"):
        load_npy(body[:-8])
    with pytest.raises(RequestError):
        load_npy(b"not npy at all")


def test_json_and_csv_decode_and_encode() -> None:
    assert decode(b"[[1, 2], [3, 4]]", JSON).shape == (2, 2)
    assert decode(b'{"instances": [[1, 2]]}', JSON).shape == (1, 2)
    both = decode(b'{"a": [1], "b": [[2, 3]]}', JSON)
    assert set(both) == {"a", "b"} and both["b"].shape == (1, 2)
    assert decode(b"1,2\n3,4\n", CSV).tolist() == [[1, 2], [3, 4]]
    assert decode(b"1,2,3", CSV, dtype=np.float32).shape == (1, 3)
    assert json.loads(encode({"x": np.array([1.5]), "y": np.int64(2)}, JSON)) == {
        "x": [1.5], "y": 2}
    assert encode(np.array([[1, 2], [3, 4]]), CSV) == b"1,2\n3,4\n"
    assert encode(np.array([0.5, 1.0]), CSV) == b"0.5\n1.0\n"
    with pytest.raises(RequestError) as info:
        encode({"a": np.ones(1), "b": np.ones(1)}, CSV)
    assert info.value.status == 406 and "accept application/json" in info.value.detail
    with pytest.raises(RequestError) as info:
        encode(np.array([object()], dtype=object), NPY)
    assert info.value.status == 406


# --- choosing a handler ----------------------------------------------------------------------

def test_select_handler(tmp_path: Path) -> None:
    opts = ServerOptions()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.onnx").write_bytes(b"")
    (tmp_path / "a" / "model.joblib").write_bytes(b"")
    assert isinstance(select_handler(tmp_path / "a", opts), OnnxHandler)  # ONNX first
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "clf-v2.skops").write_bytes(b"")
    handler = select_handler(tmp_path / "b", opts)
    assert isinstance(handler, SklearnHandler) and handler.artifact.name == "clf-v2.skops"
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "readme.md").write_text("x")
    with pytest.raises(ModelLoadError, match=r"found \['readme.md'\]"):
        select_handler(tmp_path / "c", opts)
    with pytest.raises(ModelLoadError, match="does not exist"):
        select_handler(tmp_path / "missing", opts)


# --- the queue -------------------------------------------------------------------------------

def test_queue_groups_what_arrives_while_the_model_is_busy() -> None:
    gate = threading.Event()
    seen: list[list[int]] = []

    def run(batch: list[int]) -> list[int]:
        seen.append(batch)
        gate.wait(5)  # the first batch holds the model while the rest queue up
        return [x * 10 for x in batch]

    async def main() -> list[int]:
        queue = InferenceQueue(run, max_batch_size=4, max_batch_delay_s=0, max_queue=100)
        queue.start()
        first = asyncio.ensure_future(queue.submit(0, 5))
        while not seen:
            await asyncio.sleep(0)
        rest = [asyncio.ensure_future(queue.submit(i, 5)) for i in range(1, 7)]
        await asyncio.sleep(0)
        assert queue.depth == 6
        gate.set()
        results = await asyncio.gather(first, *rest)
        await queue.close()
        return results

    assert asyncio.run(main()) == [0, 10, 20, 30, 40, 50, 60]
    assert seen == [[0], [1, 2, 3, 4], [5, 6]]


def test_queue_refuses_when_full_and_times_out() -> None:
    gate, started = threading.Event(), threading.Event()

    def run(batch: list[str]) -> list[str]:
        started.set()
        gate.wait(5)
        return batch

    async def main() -> None:
        queue = InferenceQueue(run, max_batch_size=1, max_batch_delay_s=0, max_queue=1)
        queue.start()
        running = asyncio.ensure_future(queue.submit("a", 0.05))
        while not started.is_set():
            await asyncio.sleep(0)
        queued = asyncio.ensure_future(queue.submit("b", 5))
        await asyncio.sleep(0)
        with pytest.raises(RequestError) as info:
            await queue.submit("c", 5)
        assert info.value.status == 503 and (b"retry-after", b"1") in info.value.headers
        with pytest.raises(RequestError) as info:
            await running
        assert info.value.status == 504
        gate.set()
        assert await queued == "b"
        await queue.close()

    asyncio.run(main())


# --- where the model comes from ----------------------------------------------------------------

def _tar(files: dict[str, bytes]) -> bytes:
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_resolve_model_from_fsspec_urls_into_a_private_copy() -> None:
    import uuid

    import fsspec

    from shoal.serving.artifact import resolve_model

    fs = fsspec.filesystem("memory")
    root = f"/models-{uuid.uuid4().hex[:8]}"
    fs.pipe(f"{root}/dir/model.onnx", b"onnx")
    fs.pipe(f"{root}/dir/code/inference.py", b"# script")
    fs.pipe(f"{root}/model.tar.gz", _tar({"model.joblib": b"j", "code/inference.py": b"#"}))
    for url, expected in ((f"memory://{root}/dir", {"model.onnx", "code/inference.py"}),
                          (f"memory://{root}/model.tar.gz", {"model.joblib",
                                                             "code/inference.py"})):
        resolved = resolve_model(url)
        try:
            got = {p.relative_to(resolved.path).as_posix() for p in resolved.path.rglob("*")
                   if p.is_file()}
            assert got == expected
            assert resolved.temp_dir is not None and (resolved.temp_dir.stat().st_mode & 0o077) == 0
        finally:
            resolved.cleanup()
        assert not resolved.temp_dir.exists()
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model(f"memory://{root}/missing.tar.gz")


def test_archives_cannot_write_outside_their_directory(tmp_path: Path) -> None:
    from shoal.serving.artifact import resolve_model

    evil = tmp_path / "evil.tar.gz"
    evil.write_bytes(_tar({"../../escaped.txt": b"x"}))
    with pytest.raises(ModelLoadError, match="cannot extract|outside"):
        resolve_model(evil)
    assert not (tmp_path.parent / "escaped.txt").exists()
    not_tar = tmp_path / "model.bin"
    not_tar.write_bytes(b"\x00" * 10)
    with pytest.raises(ModelLoadError, match="neither a directory nor a tar archive"):
        resolve_model(not_tar)
