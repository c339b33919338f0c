"""``python -m shoal.serving``: real uvicorn servers on ephemeral loopback ports, real httpx
clients. Servers that several tests can share are module-scoped; the rest start per test."""

from __future__ import annotations

import asyncio
import io
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from helpers import wait_until

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from shoal.export.onnx import export  # noqa: E402

NPY = "application/x-npy"
JSON = "application/json"
CSV = "text/csv"

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10  # y = x @ W.T + b
B = np.array([1.0, -1.0, 0.5], dtype=np.float32)


def expected(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) @ W.T + B


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def from_npy(body: bytes) -> np.ndarray:
    return np.load(io.BytesIO(body), allow_pickle=False)


# --- servers -------------------------------------------------------------------------------

@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=30)


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # One worker unless a test says otherwise (the default is one per CPU): a scrape of
    # /metrics then sees every request. test_the_default_is_a_worker_per_cpu tests the default.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SHOAL_ORT_INTRA_OP_THREADS": "1",
           "SHOAL_MODEL_SERVER_WORKERS": "1"}
    env.update(extra or {})
    return env


def launch(model: Path | str, workdir: Path, *args: str, env: dict[str, str] | None = None,
           ready: bool = True) -> Server:
    port_file = workdir / f"port-{uuid.uuid4().hex[:8]}"
    log = workdir / f"server-{uuid.uuid4().hex[:8]}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.serving", "--model", str(model), "--port", "0",
             "--port-file", str(port_file), *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=server_env(env))

    def port() -> int | None:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: "
                               f"{log.read_text(errors='replace')[-3000:]}")
        return int(port_file.read_text()) if port_file.exists() else None

    try:
        server = Server(proc, f"http://127.0.0.1:{wait_until(port, 60, what='port file')}", log)
        if ready:
            def pinged() -> bool:
                port()  # raises if the server died
                return httpx.get(f"{server.url}/ping", timeout=5).status_code == 200

            wait_until(pinged, 60, what="/ping 200")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return server


@pytest.fixture
def start(tmp_path: Path) -> Iterator[object]:
    servers: list[Server] = []

    def _start(model: Path | str, *args: str, **kwargs: object) -> Server:
        server = launch(model, tmp_path, *args, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield _start
    for s in servers:
        s.stop()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal.serving", *args], capture_output=True,
                          text=True, timeout=60, env=server_env(env), stdin=subprocess.DEVNULL)


# --- models ----------------------------------------------------------------------------------

def linear_module() -> torch.nn.Module:
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(W))
        lin.bias.copy_(torch.from_numpy(B))
    return lin


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    onnx_dir = root / "onnx"
    export(linear_module(), torch.randn(1, 4), onnx_dir / "model.onnx")

    import joblib
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4))
    sk_dir = root / "sklearn"
    sk_dir.mkdir()
    joblib.dump(LinearRegression().fit(X, X @ np.array([1.0, 2.0, 3.0, 4.0]) + 0.5),
                sk_dir / "model.joblib")

    ts_dir = root / "torchscript"
    ts_dir.mkdir()
    with warnings.catch_warnings():  # TorchScript is deprecated in torch 2.13, still served
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(linear_module()).save(str(ts_dir / "model.pt"))
    return {"onnx": onnx_dir, "sklearn": sk_dir, "torchscript": ts_dir}


def script_model(root: Path, source: str, *, artifact: Path | None = None) -> Path:
    model_dir = root / f"script-{uuid.uuid4().hex[:8]}"
    (model_dir / "code").mkdir(parents=True)
    (model_dir / "code" / "inference.py").write_text(textwrap.dedent(source))
    if artifact is not None:
        (model_dir / artifact.name).write_bytes(artifact.read_bytes())
    return model_dir


@pytest.fixture(scope="module")
def onnx_server(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Server]:
    server = launch(models["onnx"], tmp_path_factory.mktemp("onnx-server"),
                    "--max-payload-mb", "0.01")
    yield server
    assert server.stop() == 0


def metric(server: Server, name: str, labels: str = "") -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


# --- the ONNX handler: content types, Accept, errors ------------------------------------------

def test_onnx_answers_each_content_type_in_kind(onnx_server: Server) -> None:
    x = np.array([[1, 2, 3, 4], [0, -1, 0.5, 2]], dtype=np.float32)
    with onnx_server.client() as c:
        r = c.post("/invocations", content=npy(x), headers={"content-type": NPY})
        assert r.status_code == 200 and r.headers["content-type"] == NPY
        np.testing.assert_allclose(from_npy(r.content), expected(x), rtol=1e-5)

        r = c.post("/invocations", json=x.tolist())
        assert r.status_code == 200 and r.headers["content-type"] == JSON
        np.testing.assert_allclose(r.json(), expected(x), rtol=1e-5)

        r = c.post("/invocations", json={"instances": x.tolist()})
        np.testing.assert_allclose(r.json(), expected(x), rtol=1e-5)

        r = c.post("/invocations", content=b"1,2,3,4\n0,-1,0.5,2\n",
                   headers={"content-type": CSV})
        assert r.status_code == 200 and r.headers["content-type"] == CSV
        rows = [[float(v) for v in line.split(",")] for line in r.text.splitlines()]
        np.testing.assert_allclose(rows, expected(x), rtol=1e-5)


@pytest.mark.parametrize(("accept", "want"), [
    (None, NPY), ("*/*", NPY), (JSON, JSON), (f"{CSV};q=0.5, {JSON}", JSON),
    ("text/*", CSV), ("application/*", NPY), (f"image/png, {CSV};q=0.2", CSV),
])
def test_accept_negotiation(onnx_server: Server, accept: str | None, want: str) -> None:
    x = np.ones((1, 4), np.float32)
    headers = {"content-type": NPY} | ({"accept": accept} if accept else {})
    r = httpx.post(f"{onnx_server.url}/invocations", content=npy(x), headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == want
    if want == JSON:
        np.testing.assert_allclose(r.json(), expected(x), rtol=1e-5)


def test_json_requests_default_to_json_and_unknown_accept_is_406(onnx_server: Server) -> None:
    with onnx_server.client() as c:
        r = c.post("/invocations", json=[[1, 2, 3, 4]], headers={"accept": "*/*"})
        assert r.headers["content-type"] == JSON
        r = c.post("/invocations", json=[[1, 2, 3, 4]], headers={"accept": "image/png"})
        assert r.status_code == 406
        assert r.json()["error"] == "not acceptable" and "image/png" in r.json()["detail"]


@pytest.mark.parametrize(("body", "ctype", "status", "needle"), [
    (b"{not json", JSON, 400, "not valid JSON"),
    (b'[[1, 2], [3]]', JSON, 400, "rectangular"),
    (b"a,b,c,d\n", CSV, 400, "rows of numbers"),
    (b"\x93NUMPY garbage", NPY, 400, "application/x-npy"),
    (b"1,2,3,4", "image/png", 415, "image/png"),
    (b"<x/>", "application/xml; charset=utf-8", 415, "application/xml"),
])
def test_bad_bodies(onnx_server: Server, body: bytes, ctype: str, status: int,
                    needle: str) -> None:
    r = httpx.post(f"{onnx_server.url}/invocations", content=body,
                   headers={"content-type": ctype})
    assert r.status_code == status
    assert set(r.json()) == {"error", "detail"} and needle in r.json()["detail"]


def test_npy_with_pickled_objects_is_refused(onnx_server: Server, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = np.array([_Pwn(str(marker)), 1], dtype=object)
    buf = io.BytesIO()
    np.save(buf, evil, allow_pickle=True)
    r = httpx.post(f"{onnx_server.url}/invocations", content=buf.getvalue(),
                   headers={"content-type": NPY})
    assert r.status_code == 400 and "pickle" in r.json()["detail"]
    raw = httpx.post(f"{onnx_server.url}/invocations", content=pickle.dumps(_Pwn(str(marker))),
                     headers={"content-type": NPY})
    assert raw.status_code == 400
    assert not marker.exists()


class _Pwn:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_model_errors_are_424_with_the_models_message(onnx_server: Server) -> None:
    r = httpx.post(f"{onnx_server.url}/invocations", json=[[1, 2, 3]])
    assert r.status_code == 424
    body = r.json()
    assert body["error"] == "model error" and "dimension" in body["detail"].lower()


def test_payload_limit_by_content_length_and_by_streamed_size(onnx_server: Server) -> None:
    big = npy(np.ones((1000, 4), np.float32))  # 16 KB > 0.01 MB
    r = httpx.post(f"{onnx_server.url}/invocations", content=big, headers={"content-type": NPY})
    assert r.status_code == 413 and "limit" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]

    r = httpx.post(f"{onnx_server.url}/invocations", content=chunks(),
                   headers={"content-type": NPY})
    assert r.status_code == 413 and "arrived" in r.json()["detail"]
    assert httpx.get(f"{onnx_server.url}/ping").status_code == 200


def test_other_routes(onnx_server: Server) -> None:
    with onnx_server.client() as c:
        assert c.get("/ping").json() == {"status": "healthy"}
        assert c.get("/nope").status_code == 404
        assert c.get("/invocations").status_code == 405
        params = c.get("/execution-parameters").json()
        assert params["MaxConcurrentTransforms"] > 1  # one worker that batches
        assert params["BatchStrategy"] == "MULTI_RECORD" and params["MaxPayloadInMB"] == 1
        before = metric(onnx_server, "shoal_invocations_total", '{status="200"}')
        c.post("/invocations", json=[[0, 0, 0, 0]])
        text = c.get("/metrics").text
    assert metric(onnx_server, "shoal_invocations_total", '{status="200"}') == before + 1
    for name in ("shoal_invocation_latency_seconds_bucket", "shoal_batch_size_bucket",
                 "shoal_queue_depth", "shoal_model_loaded 1.0"):
        assert name in text


# --- other automatic handlers ------------------------------------------------------------------

def test_sklearn_handler(models: dict[str, Path], start) -> None:
    server = start(models["sklearn"])
    x = np.array([[1.0, 0, 0, 0], [0, 0, 0, 1]])
    with server.client() as c:
        r = c.post("/invocations", content=b"1,0,0,0\n0,0,0,1\n", headers={"content-type": CSV})
        assert r.status_code == 200 and r.headers["content-type"] == CSV
        np.testing.assert_allclose([float(v) for v in r.text.split()], [1.5, 4.5])
        r = c.post("/invocations", json=x.tolist())
        np.testing.assert_allclose(r.json(), [1.5, 4.5])
        r = c.post("/invocations", content=npy(x[0]), headers={"content-type": NPY})
        np.testing.assert_allclose(from_npy(r.content), [1.5])
        r = c.post("/invocations", json=[[1, 2]])
        assert r.status_code == 424 and "feature" in r.json()["detail"]


def test_torchscript_handler(models: dict[str, Path], start) -> None:
    server = start(models["torchscript"])
    x = np.array([[1, 2, 3, 4]], dtype=np.float64)  # float64 in: cast to the module's float32
    with server.client() as c:
        r = c.post("/invocations", content=npy(x), headers={"content-type": NPY})
        assert r.status_code == 200
        np.testing.assert_allclose(from_npy(r.content), expected(x), rtol=1e-5)
        r = c.post("/invocations", json=[[1.0, 2.0]])
        assert r.status_code == 424 and "shapes cannot be multiplied" in r.json()["detail"]


# --- inference.py handlers ---------------------------------------------------------------------

def test_inference_script_with_context_and_every_function(tmp_path: Path, start) -> None:
    model_dir = script_model(tmp_path, """
        import json
        import numpy as np
        from helper_module import SCALE  # a sibling module in code/

        def model_fn(model_dir, context):
            assert context.system_properties["model_dir"] == model_dir
            return {"scale": SCALE, "dir": model_dir}

        def input_fn(body, content_type, context):
            if content_type != "application/json":
                raise ValueError(f"only JSON, not {content_type}")
            return np.asarray(json.loads(body)["values"], dtype=float)

        def predict_fn(data, model, context):
            if data.size == 0:
                raise RuntimeError("need at least one value")
            return data * model["scale"]

        def output_fn(prediction, accept, context):
            if accept == "text/plain":
                return " ".join(str(v) for v in prediction.tolist()), "text/plain"
            return json.dumps({"scaled": prediction.tolist()})
    """)
    (model_dir / "code" / "helper_module.py").write_text("SCALE = 10\n")
    server = start(model_dir)
    with server.client() as c:
        r = c.post("/invocations", json={"values": [1, 2.5]})
        assert r.status_code == 200 and r.json() == {"scaled": [10.0, 25.0]}
        assert r.headers["content-type"] == JSON
        r = c.post("/invocations", json={"values": [1]}, headers={"accept": "text/plain"})
        assert r.text == "10.0" and r.headers["content-type"] == "text/plain"
        r = c.post("/invocations", content=b"1,2", headers={"content-type": CSV})
        assert r.status_code == 400 and "only JSON" in r.json()["detail"]
        r = c.post("/invocations", json={"values": []})
        assert r.status_code == 424 and "need at least one value" in r.json()["detail"]
        params = c.get("/execution-parameters").json()
        assert params["BatchStrategy"] == "SINGLE_RECORD"


def test_inference_script_without_context_and_default_codecs(tmp_path: Path, start) -> None:
    model_dir = script_model(tmp_path, """
        def model_fn(model_dir):
            return lambda x: x.sum(axis=1)

        def predict_fn(data, model):
            return model(data)
    """)
    server = start(model_dir)
    with server.client() as c:
        r = c.post("/invocations", content=npy(np.ones((2, 3))), headers={"content-type": NPY})
        np.testing.assert_allclose(from_npy(r.content), [3.0, 3.0])
        r = c.post("/invocations", json=[[1, 2], [3, 4]], headers={"accept": CSV})
        assert r.text == "3\n7\n" and r.headers["content-type"] == CSV
        r = c.post("/invocations", json=[[1]], headers={"accept": "image/png"})
        assert r.status_code == 406


def test_inference_script_transform_fn(tmp_path: Path, start) -> None:
    model_dir = script_model(tmp_path, """
        def model_fn(model_dir):
            return "model"

        def transform_fn(model, body, content_type, accept):
            if body == b"boom":
                raise ValueError("transform_fn exploded")
            return body.upper() + f" {model} {content_type} {accept}".encode(), "text/plain"
    """)
    server = start(model_dir)
    with server.client() as c:
        r = c.post("/invocations", content=b"hello", headers={"content-type": "text/anything",
                                                             "accept": "text/x-mine"})
        assert r.status_code == 200
        assert r.text == "HELLO model text/anything text/x-mine"
        r = c.post("/invocations", content=b"boom", headers={"content-type": "text/plain"})
        assert r.status_code == 424 and "transform_fn exploded" in r.json()["detail"]


def test_inference_script_uses_the_artifact_when_it_has_no_model_fn(
        models: dict[str, Path], tmp_path: Path, start) -> None:
    model_dir = script_model(tmp_path, """
        import numpy as np

        def input_fn(body, content_type):
            return np.frombuffer(body, dtype=np.float32).reshape(-1, 4)
    """, artifact=models["onnx"] / "model.onnx")
    server = start(model_dir)
    x = np.array([[1, 2, 3, 4]], np.float32)
    r = httpx.post(f"{server.url}/invocations", content=x.tobytes(),
                   headers={"content-type": "application/octet-stream", "accept": JSON})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json(), expected(x), rtol=1e-5)


# --- batching --------------------------------------------------------------------------------

async def _concurrent(url: str, bodies: list[bytes], ctype: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        return await asyncio.gather(*(c.post("/invocations", content=b,
                                             headers={"content-type": ctype}) for b in bodies))


def _batches(server: Server) -> tuple[float, float, float]:
    """(batches run, requests in them, batches of exactly one)."""
    return (metric(server, "shoal_batch_size_count"), metric(server, "shoal_batch_size_sum"),
            metric(server, "shoal_batch_size_bucket", '{le="1.0"}'))


def test_onnx_batches_concurrent_requests_and_each_gets_its_answer(
        models: dict[str, Path], start) -> None:
    server = start(models["onnx"], "--max-batch-size", "8", "--max-batch-delay-ms", "500")
    inputs = [np.full((1 + i % 3, 4), i, np.float32) for i in range(16)]  # 1 to 3 rows each
    responses = asyncio.run(_concurrent(server.url, [npy(x) for x in inputs], NPY))
    for x, r in zip(inputs, responses, strict=True):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(from_npy(r.content), expected(x), rtol=1e-5)
    batches, requests, singles = _batches(server)
    assert requests == 16
    assert batches < 16 and singles < batches  # some batches held several requests
    assert "batches of up to 8, 500 ms delay" in server.output()


def test_a_bad_request_in_a_batch_fails_alone(models: dict[str, Path], start) -> None:
    server = start(models["onnx"], "--max-batch-size", "8", "--max-batch-delay-ms", "500")
    bodies = [npy(np.ones((1, 4), np.float32))] * 5 + [npy(np.ones((1, 5), np.float32))]
    responses = asyncio.run(_concurrent(server.url, bodies, NPY))
    assert [r.status_code for r in responses] == [200] * 5 + [424]
    assert _batches(server)[0] < 6


@pytest.mark.parametrize("declared", ["BATCHABLE = True", "predict_fn.batchable = True"])
def test_batchable_predict_fn(declared: str, tmp_path: Path, start) -> None:
    model_dir = script_model(tmp_path, f"""
        import numpy as np

        def model_fn(model_dir):
            return 2.0

        def predict_fn(batch, model):
            assert isinstance(batch, list)
            return [np.asarray(x) * model for x in batch]

        {declared}
    """)
    server = start(model_dir, "--max-batch-size", "16", "--max-batch-delay-ms", "500")
    inputs = [np.full((2,), i, np.float64) for i in range(12)]
    responses = asyncio.run(_concurrent(server.url, [npy(x) for x in inputs], NPY))
    for x, r in zip(inputs, responses, strict=True):
        np.testing.assert_allclose(from_npy(r.content), x * 2)
    batches, requests, _ = _batches(server)
    assert requests == 12 and batches < 12


# --- overload, time limits, loading -------------------------------------------------------------

BLOCKING = """
    import pathlib, time

    def model_fn(model_dir):
        return pathlib.Path(model_dir)

    def predict_fn(data, model):
        (model / "started").touch()
        while not (model / "release").exists():
            time.sleep(0.01)
        return data
"""


def test_timeout_and_full_queue_while_ping_stays_up(tmp_path: Path, start) -> None:
    model_dir = script_model(tmp_path, BLOCKING)
    server = start(model_dir, "--timeout-s", "2", "--max-queue", "1")
    body = npy(np.ones(2))
    try:
        with server.client() as c:
            r = c.post("/invocations", content=body, headers={"content-type": NPY})
            assert r.status_code == 504
            assert "longer than 2 s" in r.json()["detail"] and "still up" in r.json()["detail"]
            assert c.get("/ping").status_code == 200  # the hung model does not block the loop

            # The model's thread is still stuck in the first request: the next one queues...
            with httpx.Client(base_url=server.url, timeout=30) as other, \
                    _in_background(lambda: other.post("/invocations", content=body,
                                                      headers={"content-type": NPY})) as queued:
                wait_until(lambda: metric(server, "shoal_queue_depth") == 1, 20,
                           what="one request queued")
                # ... and with --max-queue 1 the one after it is refused at once.
                r = c.post("/invocations", content=body, headers={"content-type": NPY})
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                assert "waiting for the model" in r.json()["detail"]
                assert c.get("/ping").status_code == 200
            assert queued.result().status_code == 504
    finally:
        (model_dir / "release").touch()
    assert metric(server, "shoal_invocations_total", '{status="503"}') == 1


class _in_background:
    def __init__(self, fn) -> None:
        import concurrent.futures

        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._fn = fn

    def __enter__(self):
        self.future = self._pool.submit(self._fn)
        return self.future

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)


def test_ping_is_503_while_a_slow_model_fn_loads(tmp_path: Path, start) -> None:
    model_dir = script_model(tmp_path, """
        import pathlib, time

        def model_fn(model_dir):
            while not (pathlib.Path(model_dir) / "release").exists():
                time.sleep(0.01)
            return lambda x: x

        def predict_fn(data, model):
            return model(data)
    """)
    server = start(model_dir, ready=False)
    with server.client() as c:
        r = c.get("/ping")
        assert r.status_code == 503 and r.json()["error"] == "model loading"
        assert c.post("/invocations", json=[1]).status_code == 503
        (model_dir / "release").touch()
        wait_until(lambda: c.get("/ping").status_code == 200, 30, what="/ping 200")
        assert c.post("/invocations", json=[1, 2]).json() == [1, 2]


# --- start-up failures, archives, workers, signals ----------------------------------------------

def test_a_directory_without_a_model_fails_naming_its_files(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "weights.bin").write_bytes(b"x")
    (tmp_path / "m" / "notes.txt").write_text("x")
    proc = run_cli("--model", str(tmp_path / "m"), "--port", "0")
    assert proc.returncode == 1
    assert "no model this server recognises" in proc.stderr
    assert "notes.txt" in proc.stderr and "weights.bin" in proc.stderr


def test_inference_script_that_raises_on_import_exits_with_the_traceback(tmp_path: Path) -> None:
    model_dir = script_model(tmp_path, """
        import definitely_not_a_module_xyz
    """)
    proc = run_cli("--model", str(model_dir), "--port", "0")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert "definitely_not_a_module_xyz" in proc.stderr and "inference.py" in proc.stderr


def test_port_in_use_is_a_clear_error(models: dict[str, Path]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = run_cli("--model", str(models["onnx"]), "--port", str(port))
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--max-batch-size", "0"], {}, "max_batch_size must be >= 1, got 0"),
    (["--max-batch-size", "-4"], {}, "max_batch_size must be >= 1, got -4"),
    (["--max-batch-size", "2.5"], {}, "invalid int value: '2.5'"),
    (["--max-batch-delay-ms", "5"], {}, "max_batch_delay_ms was given without max_batch_size"),
    (["--max-batch-size", "4", "--max-batch-delay-ms", "-1"], {}, "max_batch_delay_ms must be"),
    (["--workers", "0"], {}, "workers must be >= 1"),
    (["--timeout-s", "0"], {}, "timeout_s must be > 0"),
    ([], {"SHOAL_MAX_BATCH_SIZE": "lots"}, "SHOAL_MAX_BATCH_SIZE='lots' is not an integer"),
    ([], {"SHOAL_MAX_BATCH_DELAY_MS": "3"}, "max_batch_delay_ms was given without"),
    ([], {"SHOAL_MODEL_SERVER_WORKERS": "-1"}, "workers must be >= 1, got -1"),
])
def test_malformed_options_fail_at_start(models: dict[str, Path], args: list[str],
                                         env: dict[str, str], needle: str) -> None:
    proc = run_cli("--model", str(models["onnx"]), "--port", "0", *args, env=env)
    assert proc.returncode == 2
    assert needle in proc.stderr


def test_serves_a_model_tar_gz_by_path_and_by_url(models: dict[str, Path], tmp_path: Path,
                                                  start) -> None:
    model_dir = script_model(tmp_path, """
        import numpy as np

        def predict_fn(data, model):
            return model.run(None, {"input": np.asarray(data, np.float32)})[0] + 100
    """, artifact=models["onnx"] / "model.onnx")
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(model_dir.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(model_dir)), recursive=False)
    x = np.ones((1, 4), np.float32)
    for model in (archive, f"file://{archive}"):
        server = start(model)
        r = httpx.post(f"{server.url}/invocations", json=x.tolist())
        np.testing.assert_allclose(r.json(), expected(x) + 100, rtol=1e-5)
        extracted = re.search(r"\(model (\S+),", server.output()).group(1)
        assert Path(extracted).is_dir() and str(tmp_path) not in extracted
        assert server.stop() == 0
        assert not Path(extracted).exists()  # the private copy is removed on exit


def test_two_workers_serve_and_stop_together(models: dict[str, Path], start) -> None:
    server = start(models["onnx"], env={"SHOAL_MODEL_SERVER_WORKERS": "2"})
    assert "2 workers" in server.output()
    x = np.ones((1, 4), np.float32)
    # /ping said 200 (in start): every worker has its model, whichever takes the connection
    for _ in range(8):
        with server.client() as c:  # a new connection each time: either worker
            r = c.post("/invocations", json=x.tolist())
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(r.json(), expected(x), rtol=1e-5)
    assert server.stop() == 0


def test_the_default_is_a_worker_per_cpu(models: dict[str, Path], tmp_path: Path,
                                          start) -> None:
    """No --workers and no SHOAL_MODEL_SERVER_WORKERS: a worker per CPU the process may use
    (its affinity mask), each serving; a server pinned to one CPU runs one process."""
    cpus = len(os.sched_getaffinity(0))
    server = start(models["onnx"], env={"SHOAL_MODEL_SERVER_WORKERS": "",
                                        "SHOAL_ORT_INTRA_OP_THREADS": ""})
    assert f"{cpus} worker{'s' if cpus > 1 else ''})" in server.output()
    wait_until(lambda: server.output().count("model ready in") == cpus, 60,
               what=f"all {cpus} workers to load the model")
    x = np.ones((1, 4), np.float32)
    for _ in range(2 * cpus):
        with server.client() as c:  # a new connection each time: any worker
            r = c.post("/invocations", json=x.tolist())
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(r.json(), expected(x), rtol=1e-5)
    assert server.stop() == 0

    one = min(os.sched_getaffinity(0))
    port_file, log = tmp_path / "pinned-port", tmp_path / "pinned.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.serving", "--model", str(models["onnx"]), "--port",
             "0", "--port-file", str(port_file)], stdout=out, stderr=subprocess.STDOUT,
            env=server_env({"SHOAL_MODEL_SERVER_WORKERS": ""}),
            preexec_fn=lambda: os.sched_setaffinity(0, {one}))
    pinned = Server(proc, "", log)
    try:
        wait_until(lambda: "model ready in" in log.read_text() or proc.poll() is not None, 60,
                   what="the pinned server's model")
        assert proc.poll() is None, log.read_text()
        assert "(model " in log.read_text() and ", 1 worker)" in log.read_text()
    finally:
        assert pinned.stop() == 0


def test_ping_is_200_only_once_every_worker_has_its_model(models: dict[str, Path],
                                                          tmp_path: Path, start) -> None:
    """Two workers, one of them slow to load (it waits for a file): until both have the model,
    /ping answers 503 on every connection, and no request reaches a worker without its
    model; then every request is served."""
    release = tmp_path / "release"
    model_dir = script_model(tmp_path, f"""
        import os, time

        def model_fn(model_dir):
            try:  # the first worker loads at once, the other waits for the test
                os.close(os.open({str(tmp_path / "first")!r}, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                deadline = time.monotonic() + 120
                while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:
                    time.sleep(0.01)
            return os.getpid()

        def predict_fn(data, model):
            return {{"pid": model}}
    """, artifact=models["onnx"] / "model.onnx")
    server = start(model_dir, env={"SHOAL_MODEL_SERVER_WORKERS": "2"}, ready=False)
    wait_until(lambda: server.output().count("model ready in") == 1, 60,
               what="the first worker to load its model")
    for _ in range(16):  # new connections: the kernel spreads them over both workers
        assert httpx.get(f"{server.url}/ping", timeout=10).status_code == 503
        r = httpx.post(f"{server.url}/invocations", json=[[1, 2, 3, 4]], timeout=10)
        assert r.status_code in (200, 503), r.text  # 200 only from the worker that loaded
    release.touch()
    wait_until(lambda: httpx.get(f"{server.url}/ping", timeout=10).status_code == 200, 60,
               what="/ping 200")
    assert server.output().count("model ready in") == 2
    pids = set()
    for _ in range(24):
        r = httpx.post(f"{server.url}/invocations", json=[[1, 2, 3, 4]], timeout=10)
        assert r.status_code == 200, r.text
        pids.add(r.json()["pid"])
    assert len(pids) == 2  # both workers served
    assert server.stop() == 0


def test_workers_share_the_connections(models: dict[str, Path], tmp_path: Path, start) -> None:
    """Each worker listens on its own socket of the port (SO_REUSEPORT): the kernel spreads
    connections over them, instead of the first awake worker taking a whole burst."""
    model_dir = script_model(tmp_path, """
        import os

        def predict_fn(data, model):
            return {"pid": os.getpid()}
    """, artifact=models["onnx"] / "model.onnx")
    server = start(model_dir, env={"SHOAL_MODEL_SERVER_WORKERS": "2"})
    wait_until(lambda: server.output().count("model ready in") == 2, 60,
               what="both workers to load the model")
    port = int(server.url.rsplit(":", 1)[1])
    body = b"[[1, 2, 3, 4]]"
    request = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    # A burst, as a load test's clients open theirs: all connected before any is served.
    conns = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(24)]
    pids = set()
    try:
        for conn in conns:
            conn.sendall(request)
        for conn in conns:
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = conn.recv(65536)
                assert chunk, f"the server closed the connection: {answer!r}"
                answer += chunk
            pids.add(json.loads(answer.split(b"\r\n\r\n", 1)[1])["pid"])
    finally:
        for conn in conns:
            conn.close()
    assert len(pids) == 2  # 24 connections on one of two sockets: odds of 1 in 8 million
    assert server.stop() == 0


def test_a_port_in_use_is_a_clear_error_with_workers_too(models: dict[str, Path]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = run_cli("--model", str(models["onnx"]), "--port", str(port), "--workers", "2")
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr


def test_importing_the_server_and_the_onnx_helpers_loads_nothing_heavy() -> None:
    code = ("import shoal.serving, shoal.serving.__main__, shoal.export.onnx, sys; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True, timeout=60).stdout.split())
    heavy = {"torch", "onnx", "onnxruntime", "uvicorn", "fastapi", "starlette", "numpy",
             "sqlalchemy", "prometheus_client", "shoal.session", "shoal.jobs"}
    assert not heavy & loaded
