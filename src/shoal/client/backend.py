"""``HttpBackend``: the ``Backend`` port through a team server, whose own backend starts the
supervisors (``POST /api/v1/launches``); ``HttpJobEnds``: the server's long polls that wake a
waiting client when a job ends, and its live log stream.

The client sends only what its supervisor may take from it (the handed-over job secrets, the
job-process mode); the server writes the rest of the environment (its home, its URL, the job's
token). A warm worker's claim stays on the server: the client reads what the worker says
through ``GET /launches/{launch}/messages`` (``_HttpWaiter``, a ``JobWaiter``). While the
server does not answer (a restart) these calls report "not yet" (a long poll) or "unknown"
(``is_alive``), so a waiting client carries on once it is back.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from shoal.client.http import ServerConnection
from shoal.core.jobs import JobRecord, JobSpec
from shoal.core.ports import ExecContext, Handle, LaunchInfo
from shoal.core.secrets import JOB_SECRETS_VAR
from shoal.errors import ApiError, BackendUnavailableError, ServerUnreachableError

__all__ = ["HttpBackend", "HttpJobEnds"]

#: What a client's supervisor environment may carry to the server (``server/_launches.py``).
_SENT = (JOB_SECRETS_VAR, "SHOAL_JOB_PROCESS")
#: One long poll at most this long (below the connection's 30 s read timeout).
_POLL_S = 20.0
_AWAY_PAUSE_S = 0.5
#: How long a batch's launch waits for a warm worker's first news: a short call's result
#: comes with the launch's answer (no poll); a longer call's log is followed soon after.
_FIRST_NEWS_S = 0.25


class HttpBackend:
    """Launches, liveness and stop signals through the server's own backend."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection
        self._name: str | None = None
        self._checked: set[str] = set()

    @property
    def name(self) -> str:
        """The server's backend (``local``, ``ray``): what runs the jobs."""
        if self._name is None:
            self._name = str(self._http.call("GET", "/launches/backend")["name"])
        return self._name

    def check_submission(self, env: Mapping[str, str]) -> None:
        sent = _sent(env)
        digest = hashlib.sha256(json.dumps(sent, sort_keys=True).encode()).hexdigest()
        if digest not in self._checked:  # the server's answer depends on its setup only
            self._http.call("POST", "/launches/check", json={"env": sent})
            self._checked.add(digest)

    def launch(self, ctx: ExecContext) -> LaunchInfo:
        out = self._http.call("POST", "/launches", json=_launch_body(ctx))
        return self._info(ctx, out)

    def _info(self, ctx: ExecContext, out: Mapping[str, Any]) -> LaunchInfo:
        waiter = _HttpWaiter(self._http, ctx.job) if out.get("warm") else None
        return LaunchInfo(str(out["backend"]), int(out["pid"]), str(out["host"]),
                          out.get("start_ticks"), waiter=waiter, extra=dict(out.get("extra")
                                                                            or {}))

    def create_and_launch(self, specs: Sequence[JobSpec], *, key_salts: Sequence[str],
                          files: Mapping[str, bytes], ctx: ExecContext
                          ) -> tuple[list[JobRecord], LaunchInfo | None, str | None]:
        """``BatchLauncher``: ``POST /launches/batch``, the records, the batch's files and
        the launch in one request (never retried: it is not idempotent)."""
        from shoal.client.jobs import job_record

        out = self._http.call("POST", "/launches/batch", json={
            "specs": [s.to_json() for s in specs], "key_salts": list(key_salts),
            "files": {k: base64.b64encode(v).decode("ascii") for k, v in files.items()},
            "launch": _launch_body(ctx), "wait": _FIRST_NEWS_S})
        records = [job_record(r) for r in out["records"]]
        launched = out.get("launch")
        info = None if launched is None else self._info(ctx, launched)
        if info is not None and isinstance(info.waiter, _HttpWaiter) and out.get("messages"):
            info.waiter.absorb(out["messages"])  # the worker's first news came with it
        return records, info, out.get("error")

    def is_alive(self, handle: Handle) -> bool | None:
        try:
            out = self._http.call("POST", "/launches/alive", json={"handle": dict(handle)})
        except ServerUnreachableError as e:
            raise BackendUnavailableError(f"the shoal server does not answer: {e}",
                                          address=self._http.url) from e
        alive = out.get("alive")
        return None if alive is None else bool(alive)

    def signal_stop(self, handle: Handle) -> None:
        self._http.call("POST", "/launches/stop", json={"handle": dict(handle)})

    def close(self) -> None:
        """Nothing of its own: the session closes the shared connection."""


def _launch_body(ctx: ExecContext) -> dict[str, Any]:
    return {"job": ctx.job, "entrypoint": ctx.entrypoint, "args": list(ctx.args),
            "env": _sent(ctx.env), "prepare": ctx.prepare, "pool": ctx.pool,
            "keep_alive_seconds": ctx.keep_alive_seconds, "cpus": ctx.cpus,
            "gpus": ctx.gpus, "memory_mib": ctx.memory_mib, "hosts": ctx.hosts,
            "batch": list(ctx.batch)}


def _sent(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[k] for k in _SENT if k in env}


class _HttpWaiter:
    """A ``JobWaiter`` over the claim the server holds on a warm worker for this client."""

    def __init__(self, connection: ServerConnection, launch: str) -> None:
        self._http = connection
        self._path = f"/launches/{quote(launch, safe='')}/messages"
        self._after = 0
        self._queue: collections.deque[tuple[dict[str, Any], bytes]] = collections.deque()
        self._end: dict[str, Any] | None = None
        self.done = False

    def _poll(self, timeout: float) -> None:
        try:
            out = self._http.call("GET", self._path, params={
                "after": str(self._after), "timeout": f"{min(timeout, _POLL_S):.3f}"})
        except ServerUnreachableError:
            time.sleep(min(timeout, _AWAY_PAUSE_S))
            return
        self.absorb(out)

    def absorb(self, out: Mapping[str, Any]) -> None:
        """Take in an answer of the messages poll (or the launch's ``messages``)."""
        for m in out["messages"]:
            self._queue.append((dict(m["header"]), base64.b64decode(m["data"])))
        self._after += len(out["messages"])
        if out["done"]:
            self._end = {"lost": True} if out.get("lost") else {"done": True}

    def read(self, timeout: float) -> tuple[dict[str, Any], bytes] | None:
        deadline = time.monotonic() + timeout
        while not self._queue and self._end is None and not self.done:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._poll(left)
        if self._queue:
            return self._queue.popleft()
        self.done = True
        return dict(self._end or {"done": True}), b""

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._end is None and not self.done:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._poll(left)
        self.done = True
        return True

    def close(self) -> None:
        self.done = True  # the server closes its claim when the worker says the job ended


class HttpJobEnds:
    """``GET /jobs/{name}/wait`` (the server answers when the job ends) and
    ``GET /jobs/{name}/logs?follow=true`` (its log as it is written)."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection
        self._lock = threading.Lock()

    def wait(self, name: str, timeout: float) -> bool:
        try:
            out = self._http.call("GET", f"/jobs/{quote(name, safe='')}/wait",
                                  params={"timeout": f"{min(timeout, _POLL_S):.3f}"})
        except ServerUnreachableError:
            time.sleep(min(timeout, _AWAY_PAUSE_S))
            return False
        return bool(out["ended"])

    def follow_log(self, name: str, offset: int, on_output: Callable[[bytes], None],
                   timeout: float) -> int:
        params = {"offset": str(offset), "follow": "true",
                  "timeout": f"{min(timeout, _POLL_S):.3f}"}
        try:
            with self._http.download(f"/jobs/{quote(name, safe='')}/logs",
                                     params=params) as response:
                for chunk in response.iter_bytes():
                    if chunk:
                        offset += len(chunk)
                        on_output(chunk)
        except (ServerUnreachableError, httpx.TransportError):
            time.sleep(_AWAY_PAUSE_S)  # dropped mid-stream: the caller resumes at the offset
        except ApiError as e:
            if e.details.get("status_code") != 404:
                raise
        return offset

