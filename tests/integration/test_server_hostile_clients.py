"""The model server and the LLM server under hostile clients (issue #15, item 7): loopback by
default, half-sent requests closed after the read timeout while ``/ping`` keeps answering,
a connection limit that keeps capacity for new clients, ``--api-key`` checked on every route
but ``/ping``, and 400 (not 500) for JSON nested too deep or integers too long.

Real servers (``python -m shoal.serving``, ``shoal serve``) in subprocesses on 127.0.0.1,
real sockets and HTTP clients."""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers import wait_until

pytest.importorskip("uvicorn")
pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from test_model_server import Server, launch, linear_module, script_model  # noqa: E402

from shoal.export.onnx import export  # noqa: E402

KEY = "s3cret-key-for-tests"
HALF_SENT = 300  # bounded: well under the test machine's file descriptor limit
DEEP = b"[" * 100_000 + b"]" * 100_000
LONG_INT = b"[" + b"7" * 5000 + b"]"


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-onnx")
    export(linear_module(), torch.randn(1, 4), root / "model.onnx")
    return root


@pytest.fixture(scope="module")
def guarded(onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The model server with a key and a 2 s read timeout."""
    server = launch(onnx_dir, tmp_path_factory.mktemp("guarded"), "--read-timeout-s", "2",
                    env={"SHOAL_API_KEY": KEY},
                    ready=False)
    wait_until(lambda: httpx.get(f"{server.url}/ping", timeout=5).status_code == 200, 60,
               what="/ping 200")
    yield server
    assert server.stop() == 0


@pytest.fixture
def start(tmp_path: Path) -> Iterator[object]:
    """``start(model, *args)``: a model server, stopped after the test."""
    servers: list[Server] = []

    def _start(model: Path, *args: str, **kwargs: object) -> Server:
        servers.append(launch(model, tmp_path, *args, **kwargs))  # type: ignore[arg-type]
        return servers[-1]

    yield _start
    for s in servers:
        s.stop()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on *port* (from /proc/net/tcp*)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                if width == 8:
                    found.add(socket.inet_ntop(socket.AF_INET,
                                               bytes.fromhex(address)[::-1]))
                else:
                    raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1]
                                   for i in range(0, 32, 8))
                    found.add(socket.inet_ntop(socket.AF_INET6, raw))
    return found


def half_sent(port: int, count: int, *, body: bool = False) -> list[socket.socket]:
    """*count* connections, each with the start of a request and never the rest: headers
    without their blank line, or (*body*) whole headers (with the key) and half the body."""
    part = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() +
            b"\r\nContent-Length: 64\r\n\r\n[[1, 2," if body else
            b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Len")
    conns = []
    try:
        for _ in range(count):
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            conn.sendall(part)
            conns.append(conn)
    except BaseException:
        for conn in conns:
            conn.close()
        raise
    return conns


def closed_by_server(conns: list[socket.socket], timeout: float) -> list[bytes]:
    """Wait (at most *timeout* s) until the server closed every connection in *conns*; what
    each received before the end."""
    received = {c: b"" for c in conns}
    open_ = set(conns)
    deadline = time.monotonic() + timeout
    while open_ and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_), [], [], max(0.0, deadline - time.monotonic()))
        for conn in ready:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                received[conn] += chunk
            else:
                open_.discard(conn)
    assert not open_, f"{len(open_)} of {len(conns)} half-sent connections are still open"
    return [received[c] for c in conns]


def timed_ping(url: str, *, headers: dict[str, str] | None = None) -> tuple[int, float]:
    started = time.monotonic()
    status = httpx.get(f"{url}/ping", timeout=15, headers=headers).status_code
    return status, time.monotonic() - started


# --- binding ---------------------------------------------------------------------------------

def test_the_module_entry_point_binds_loopback_by_default(onnx_dir: Path, tmp_path: Path,
                                                          start) -> None:
    server = start(onnx_dir)  # no --host
    assert listening_addresses(_port(server.url)) == {"127.0.0.1"}


def shoal_serve(model: Path, log: Path, *args: str, env: dict[str, str] | None = None
                ) -> tuple[subprocess.Popen[bytes], str]:
    """``shoal serve MODEL --port 0 ARGS``, its output to *log*; the process and its URL once
    it listens."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", "serve", str(model), "--port", "0", *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})

    def listening() -> str | None:
        found = re.search(r"listening on (http://\S+):(\d+)", log.read_text(errors="replace"))
        if found is None and proc.poll() is not None:
            raise AssertionError(f"shoal serve exited with {proc.returncode}: "
                                 f"{log.read_text(errors='replace')[-3000:]}")
        return f"{found.group(1)}:{found.group(2)}" if found else None

    try:
        return proc, wait_until(listening, 120, what="shoal serve to listen")
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(30)


def test_shoal_serve_binds_loopback_by_default(onnx_dir: Path, tmp_path: Path) -> None:
    proc, url = shoal_serve(onnx_dir, tmp_path / "serve.log")
    try:
        assert url.startswith("http://127.0.0.1:")
        assert listening_addresses(_port(url)) == {"127.0.0.1"}
        wait_until(lambda: httpx.get(f"{url}/ping", timeout=5).status_code == 200, 60,
                   what="/ping 200")
    finally:
        assert stop(proc) == 0


# --- half-sent requests, the connection limit ------------------------------------------------

def test_half_sent_requests_are_closed_after_the_read_timeout_and_ping_answers(
        guarded: Server) -> None:
    port = _port(guarded.url)
    conns = half_sent(port, HALF_SENT // 2) + half_sent(port, HALF_SENT // 2, body=True)
    try:
        status, seconds = timed_ping(guarded.url)
        assert status == 200 and seconds < 10  # not held up by the half-sent ones
        r = httpx.post(f"{guarded.url}/invocations", json=[[1, 2, 3, 4]], timeout=10,
                       headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200, r.text
        answers = closed_by_server(conns, timeout=30)  # read timeout 2 s
    finally:
        for conn in conns:
            conn.close()
    # headers cut short: 408, then closed; a body cut short: closed without an answer
    assert all(a.startswith(b"HTTP/1.1 408 ") and b"--read-timeout-s" in a
               for a in answers[:HALF_SENT // 2]), answers[0]
    assert all(a == b"" for a in answers[HALF_SENT // 2:])
    assert httpx.get(f"{guarded.url}/ping", timeout=10).status_code == 200


def test_past_the_connection_limit_the_longest_waiting_connections_make_room(
        onnx_dir: Path, start) -> None:
    """300 half-sent requests against a limit of 50, with a read timeout far away: the
    oldest are closed at once as new ones arrive, and new clients are served."""
    server = start(onnx_dir, "--max-connections", "50", "--read-timeout-s", "120")
    port = _port(server.url)
    conns = half_sent(port, HALF_SENT)
    try:
        assert timed_ping(server.url)[0] == 200
        r = httpx.post(f"{server.url}/invocations", json=[[1, 2, 3, 4]], timeout=10)
        assert r.status_code == 200, r.text
        assert closed_by_server(conns[:HALF_SENT - 60], timeout=30) \
            == [b""] * (HALF_SENT - 60)  # long before the read timeout
    finally:
        for conn in conns:
            conn.close()


def test_past_the_connection_limit_ping_answers_and_other_requests_get_503(
        onnx_dir: Path, tmp_path: Path, start) -> None:
    """Four connections busy in requests the model holds fill a limit of four: a fifth gets
    /ping answered, anything else 503 at once; once they finish, requests are served."""
    release = tmp_path / "release"
    model_dir = script_model(tmp_path, f"""
        import os, time

        def predict_fn(data, model):
            deadline = time.monotonic() + 120
            while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:
                time.sleep(0.01)
            return [[0.0]]
    """, artifact=onnx_dir / "model.onnx")
    server = start(model_dir, "--max-connections", "4", "--max-batch-size", "1")
    port = _port(server.url)
    request = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: 14\r\n\r\n[[1, 2, 3, 4]]")
    busy = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(4)]
    try:
        for conn in busy:
            conn.sendall(request)
        wait_until(lambda: httpx.post(f"{server.url}/invocations", json=[[1, 2, 3, 4]],
                                      timeout=10).status_code == 503, 30,
                   what="a fifth request to be refused")
        r = httpx.post(f"{server.url}/invocations", json=[[1, 2, 3, 4]], timeout=10)
        assert r.status_code == 503 and "--max-connections" in r.json()["detail"]
        assert r.headers["retry-after"] == "1"
        assert timed_ping(server.url)[0] == 200
        release.touch()
        for conn in busy:
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = conn.recv(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 ")
    finally:
        for conn in busy:
            conn.close()
    wait_until(lambda: httpx.post(f"{server.url}/invocations", json=[[1, 2, 3, 4]],
                                  timeout=10).status_code == 200, 30, what="served again")


# --- the API key -----------------------------------------------------------------------------

def test_the_api_key_guards_every_route_but_ping(guarded: Server) -> None:
    url = guarded.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                    {"Authorization": f"Basic {KEY}"}):
        for method, path in (("POST", "/invocations"), ("GET", "/metrics"),
                             ("GET", "/execution-parameters"), ("GET", "/nowhere")):
            r = httpx.request(method, url + path, headers=headers, json=[[1, 2, 3, 4]])
            assert r.status_code == 401, (headers, path, r.text)
            assert r.json()["error"] == "unauthorized"
            assert "Authorization: Bearer" in r.json()["detail"]
            assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(url + "/ping").status_code == 200
    good = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(url + "/invocations", headers=good, json=[[1, 2, 3, 4]])
    assert r.status_code == 200 and len(r.json()[0]) == 3
    assert httpx.get(url + "/metrics", headers=good).status_code == 200
    assert httpx.get(url + "/ping", headers=good).status_code == 200


def test_the_api_key_flag_and_a_blank_key(onnx_dir: Path, tmp_path: Path, start) -> None:
    server = start(onnx_dir, "--api-key", "from-the-flag")
    assert httpx.post(f"{server.url}/invocations", json=[[1, 2, 3, 4]]).status_code == 401
    assert httpx.post(f"{server.url}/invocations", json=[[1, 2, 3, 4]],
                      headers={"Authorization": "Bearer from-the-flag"}).status_code == 200
    proc = subprocess.run([sys.executable, "-m", "shoal.serving", "--model", str(onnx_dir),
                           "--port", "0"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SHOAL_API_KEY": "  "}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "SHOAL_API_KEY is blank" in proc.stderr


# --- JSON that the parsers refuse ------------------------------------------------------------

@pytest.mark.parametrize(("body", "needle"), [
    (DEEP, "nested more than"), (LONG_INT, "an integer with more than 4300 digits"),
    (b'{"a": ' * 2000 + b"1" + b"}" * 2000, "nested more than")])
def test_json_too_deep_or_with_a_huge_integer_is_a_400(guarded: Server, body: bytes,
                                                       needle: str) -> None:
    r = httpx.post(f"{guarded.url}/invocations", content=body,
                   headers={"Content-Type": "application/json",
                            "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text
    assert needle in r.json()["detail"]


def test_json_too_deep_for_a_script_without_input_fn_is_a_400(onnx_dir: Path, tmp_path: Path,
                                                              start) -> None:
    model_dir = script_model(tmp_path, """
        def predict_fn(data, model):
            return [[1.0]]
    """, artifact=onnx_dir / "model.onnx")
    server = start(model_dir)
    for body, needle in ((DEEP, "nested more than"),
                         (LONG_INT, "an integer with more than 4300 digits")):
        r = httpx.post(f"{server.url}/invocations", content=body,
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and needle in r.json()["detail"], r.text


# --- the LLM server ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``shoal serve LLM_DIR`` with a key (from SHOAL_API_KEY), a 2 s read timeout, served as
    ``tiny`` (OpenAI's ``model``)."""
    pytest.importorskip("transformers")
    from llm_models import make_tiny_llm

    root = tmp_path_factory.mktemp("hostile-llm")
    model = make_tiny_llm(root / "model")
    proc, url = shoal_serve(model, root / "serve.log", "--read-timeout-s", "2",
                            "--served-model-name", "tiny",
                            env={"SHOAL_API_KEY": KEY, "HF_HUB_OFFLINE": "1"})
    try:
        wait_until(lambda: httpx.get(f"{url}/ping", timeout=5).status_code == 200, 120,
                   what="the LLM server to load")
        yield url
    finally:
        assert stop(proc) == 0


def test_the_llm_server_binds_loopback_by_default(llm_server: str) -> None:
    assert listening_addresses(_port(llm_server)) == {"127.0.0.1"}


def test_the_llm_server_checks_the_api_key(llm_server: str) -> None:
    url = llm_server
    body = {"prompt": "The shoal", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(f"{url}/v1/completions", json=body, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "unauthorized"  # OpenAI's error shape on /v1
        r = httpx.post(f"{url}/generate", json={"inputs": "The shoal"}, headers=headers)
        assert r.status_code == 401 and r.json()["error_type"] == "unauthorized"
        assert httpx.get(f"{url}/metrics", headers=headers).status_code == 401
    assert httpx.get(f"{url}/ping").status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200
    r = httpx.post(f"{url}/v1/completions", json=body,
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_the_openai_client_with_the_api_key(llm_server: str) -> None:
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=f"{llm_server}/v1", api_key=KEY, max_retries=0)
    out = good.completions.create(model="tiny", prompt="The shoal", max_tokens=3,
                                  temperature=0)
    assert out.choices[0].text and out.usage.completion_tokens >= 1
    chat = good.chat.completions.create(model="tiny", max_tokens=2, messages=[
        {"role": "user", "content": "A reef"}])
    assert chat.choices[0].message.role == "assistant"
    assert [m.id for m in good.models.list().data] == ["tiny"]  # --served-model-name
    bad = openai.OpenAI(base_url=f"{llm_server}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@pytest.mark.parametrize(("body", "needle"), [
    (DEEP, "nested more than"),
    (b'{"inputs": "x", "parameters": {"max_new_tokens": ' + b"7" * 5000 + b"}}",
     "an integer with more than 4300 digits")])
def test_llm_json_too_deep_or_with_a_huge_integer_is_a_400(llm_server: str, body: bytes,
                                                           needle: str) -> None:
    for path in ("/invocations", "/v1/completions"):
        r = httpx.post(f"{llm_server}{path}", content=body,
                       headers={"Content-Type": "application/json",
                                "Authorization": f"Bearer {KEY}"})
        assert r.status_code == 400, r.text
        assert needle in r.text


def test_llm_half_sent_requests_are_closed_and_ping_answers(llm_server: str) -> None:
    conns = half_sent(_port(llm_server), HALF_SENT // 2) \
        + half_sent(_port(llm_server), HALF_SENT // 2, body=True)
    try:
        status, seconds = timed_ping(llm_server)
        assert status == 200 and seconds < 10  # not held up by the half-sent ones
        closed_by_server(conns, timeout=30)
    finally:
        for conn in conns:
            conn.close()
    assert httpx.get(f"{llm_server}/ping", timeout=10).status_code == 200


def test_unique_keys_are_not_logged(guarded: Server) -> None:
    assert KEY not in guarded.output()
