"""A Serve replica whose model has its own environment (``dependencies=``, or the model's
``code/requirements.txt``): the model server runs there, as on the local backend.

The replica builds the environment on its node with shoal's own builder (``UvEnvBuilder``,
cached under the node's shoal home by the same lock key as jobs and local endpoints), starts
``python -m shoal.serving`` in it on a free loopback port (dying with the replica,
``PR_SET_PDEATHSIG``), waits for its ``/ping``, and forwards Serve's requests to it
(``Forward``), streaming the answers (LLM token streams included). A server that exits or
does not answer in time fails the replica with the end of its output, as a local instance
does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from shoal.backends.ray_node import node_home
from shoal.config import child_environ
from shoal.endpoints._staging import (
    code_requirements,
    requirements_base,
    server_requirements,
    serving_pythonpath,
)
from shoal.errors import ModelLoadError, ShoalError

__all__ = ["Forward", "ServerProcess", "wanted_requirements"]

_HOST = "127.0.0.1"
# Run by the model's interpreter: SIGTERM when the replica dies, then become the server.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(70)  # the replica died while this process started
os.execv(sys.argv[2], sys.argv[2:])
"""
#: Headers of one hop, which the forwarder's own connections set.
_HOP_HEADERS = frozenset({b"host", b"connection", b"keep-alive", b"transfer-encoding",
                          b"content-length"})
#: Printable ASCII that a request target carries as it is (the rest is percent-encoded).
_URL_SAFE = "!#$%&'()*+,-./:;=?@[]^_`{|}~"
_HOP_ANSWER_HEADERS = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})


def wanted_requirements(spec: Mapping[str, Any], model_dir: Path) -> list[str]:
    """The model's requirements: the deployer's (``dependencies=``) and the model's own
    ``code/requirements.txt``; empty when it runs in the replica's interpreter."""
    wanted = []
    if spec.get("requirements_uri"):
        import fsspec

        with fsspec.open(str(spec["requirements_uri"]), "rb") as f:
            wanted.append(f.read().decode())
    own = code_requirements(model_dir)
    if own:
        wanted.append(own)
    return wanted


class ServerProcess:
    """The model server in the model's environment, on this node."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, root: Path) -> None:
        self._argv = argv
        self._env = env
        self._cwd = cwd
        self.log = root / "server.log"
        self._port_file = root / "port"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @classmethod
    def build(cls, spec: Mapping[str, Any], model_dir: Path, root: Path,
              wanted: list[str]) -> ServerProcess:
        """Build (or reuse) the model's environment; the server is not started yet."""
        from shoal.endpoints._supervisor import SERVER_DISTRIBUTIONS, SERVER_MODULE
        from shoal.envs import UvEnvBuilder

        # The node's shoal home, as the Ray backend picks it for jobs (the client's when this
        # node can write it, else the node user's).
        home = node_home(spec.get("home"))
        builder = UvEnvBuilder(home / "envs", resolve_ttl_seconds=float(spec["resolve_ttl_s"]))
        try:
            built = builder.ensure("\n".join(wanted), base_dir=requirements_base(model_dir),
                                   extra=server_requirements(SERVER_DISTRIBUTIONS),
                                   log=_write_out)
        except ShoalError as e:
            raise ModelLoadError(f"the model's environment could not be built: {e}") from e
        sys.stdout.write(f"[shoal] endpoint {spec.get('endpoint')}: environment "
                         f"{built.key[:12]} ({'cached' if built.cached else 'built'})\n")
        runtime = serving_pythonpath(home / "envs" / "serving-runtime")
        # The node's environment, less shoal's own settings (as the local supervisor does): the
        # server reads none of them, and a node's SHOAL_API_KEY would lock out this replica.
        env = {k: v for k, v in child_environ(PYTHONPATH=str(runtime),
                                              PYTHONUNBUFFERED="1").items()
               if not k.startswith("SHOAL_")}
        server = cls([], env, model_dir, root)
        server._argv = [str(built.python), "-m", SERVER_MODULE, "--model", str(model_dir),
                        "--host", _HOST, "--port", "0", "--port-file", str(server._port_file)]
        batching = spec.get("batching") or {}
        if batching:
            server._argv += ["--max-batch-size", str(batching["max_batch_size"]),
                             "--max-batch-delay-ms", f"{batching['max_batch_delay_ms']:g}"]
        return server

    def start(self) -> None:
        """Start the server. Call from the thread that lives as long as the replica (the
        server dies with it: ``PR_SET_PDEATHSIG`` follows the thread). The replica is a
        threaded process, so nothing runs between fork and exec: the server's interpreter
        sets the signal itself (``_DIE_WITH_PARENT``), then execs the server."""
        argv = [self._argv[0], "-c", _DIE_WITH_PARENT, str(os.getpid()), *self._argv]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=self._env,
                                         cwd=self._cwd)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def wait_ready(self, timeout: float) -> None:
        """Until the server answers ``/ping`` with 200; ModelLoadError (with its output) if
        it exits or runs out of *timeout*."""
        import httpx

        deadline = time.monotonic() + timeout
        delay = 0.02
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                assert self.proc is not None, "start() first"
                code = self.proc.poll()
                if code is not None:
                    raise ModelLoadError(f"the model server exited with code {code} while "
                                         f"loading the model; its output ends with:\n"
                                         f"{self.tail()}")
                if self.port is None and self._port_file.is_file():
                    text = self._port_file.read_text().strip()
                    self.port = int(text) if text else None
                if self.port is not None:
                    try:
                        if (await client.get(f"http://{_HOST}:{self.port}/ping")
                                ).status_code == 200:
                            return
                    except httpx.HTTPError:
                        pass  # not listening yet
                if time.monotonic() >= deadline:
                    self.stop()
                    raise ModelLoadError(
                        f"the model server did not answer /ping with 200 within {timeout:g} s "
                        f"(container_startup_health_check_timeout); its output ends with:\n"
                        f"{self.tail()}")
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, 0.25)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Forward:
    """An ASGI app that forwards each request to the server on *port* and streams back its
    answer (status, headers, body as it comes); 502 naming *endpoint* when that server
    cannot be reached."""

    def __init__(self, port: int, endpoint: str = "") -> None:
        import httpx

        self._endpoint = endpoint
        # No read limit: the server answers 504 itself past its invocation timeout.
        self._origin = f"http://{_HOST}:{port}"
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0, pool=60.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import httpx

        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left mid-request: never run the model on half a body
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        # The path as the client sent it (raw_path: percent-encoding kept) and its query,
        # with only what is not printable ASCII percent-encoded.
        path = scope.get("raw_path") or quote(scope["path"]).encode()
        query = scope.get("query_string") or b""
        url = self._origin + quote(path, safe=_URL_SAFE) + (
            "?" + quote(query, safe=_URL_SAFE) if query else "")
        headers = [(k, v) for k, v in scope.get("headers") or () if k not in _HOP_HEADERS]
        request = self._client.build_request(scope["method"], url, headers=headers,
                                             content=bytes(body))
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as e:
            detail = (f"endpoint {self._endpoint!r}: the model server in the model's own "
                      f"environment did not answer ({type(e).__name__}: {e})")
            payload = json.dumps({"error": "bad gateway", "detail": detail}).encode()
            await send({"type": "http.response.start", "status": 502,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw
                                    if k.lower() not in _HOP_ANSWER_HEADERS]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()


def _write_out(message: str) -> None:
    """The environment build's progress, to the replica's stdout (its log)."""
    sys.stdout.write(message)
