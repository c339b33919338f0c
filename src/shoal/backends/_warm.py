"""Warm pools on this machine: supervisors that stay alive to take the next compatible job.

Each warm worker listens on ``<pool>/<pid>.sock`` and owns ``<pool>/<pid>.claim``. A client
claims an idle worker by taking the claim file's lock, hands it one job (or a batch of jobs),
and is told when the job has ended (for a batch: which jobs ended, as they end); a worker
retires after its keep-alive period only when it can take its own claim lock, so a worker is
never retired under a client that just claimed it.

Worker to client, for a batch: JSON lines ``{"jobs": [...], "size": n}`` each followed by *n*
bytes, then ``{"done": true}``. For one job: ``{"done": true}``.

A batch may be handed over with its take (``ExecContext.take``: the first record and the calls,
which a team server has at hand): the worker answers ``{"ok": true, ..., "take": "inline"}``
and, before it runs anything, reads one more line from the claimer, ``{"statuses": {...},
"handle": {...}}`` once the claimer has recorded the worker's handle on the jobs (or
``{"error": why}``), instead of taking the jobs through the stores. Such a worker also has the
claimer record what happens to the jobs: ``{"record": [changes], "files": [[key, size],
...], "size": n}`` followed by the files' bytes, answered ``{"applied": [...]}`` (or
``{"error": {"code", "message"}}``), before it says which jobs ended.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from shoal.backends.procfs import start_ticks
from shoal.backends.rundir import private_socket_dir
from shoal.core.jobs import JobRecord, JobStatus
from shoal.core.ports import HandedTake, Handle

__all__ = ["OWNER_FILE", "WarmClaim", "WarmEndpoint", "WarmRequest", "claim_worker",
           "pool_dir"]

#: In a pool's directory: the run directory of the home it serves (``shoal workers`` finds
#: pools that live in the private socket directory by it).
OWNER_FILE = "run_dir"
#: Longest a worker waits for its claimer to record a batch's changes.
_RECORD_WAIT_S = 120.0


def pool_dir(run_dir: Path, pool: str) -> Path:
    """The directory of a pool; short enough for AF_UNIX paths (108 bytes)."""
    path = Path(run_dir) / "warm" / pool[:16]
    if len(str(path)) > 80:
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        path = private_socket_dir() / "warm" / digest
    return path


def _recv_line(sock: socket.socket, buf: bytearray | None = None) -> dict[str, Any]:
    """The next JSON line from *sock*; what was read past it stays in *buf* (a worker that
    ends a job at once sends its news right behind its answer, in the same read)."""
    if buf is None:
        buf = bytearray()
    seen = 0  # bytes searched already: a long line (a handed take) is searched once
    while (end := buf.find(b"\n", seen)) < 0:
        seen = len(buf)
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    line = bytes(buf[:end])
    del buf[:end + 1]
    message: dict[str, Any] = json.loads(line)
    return message


def _send_line(sock: socket.socket, message: Mapping[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


class WarmClaim:
    """A client's hold on one warm worker for one job (or one batch)."""

    def __init__(self, sock: socket.socket, lock: IO[str], pid: int,
                 ticks: int | None = None, received: bytes = b"", *,
                 inline: bool = False) -> None:
        self._sock, self._lock, self.pid = sock, lock, pid
        self.start_ticks = ticks
        self.done = False
        self._buf = bytearray(received)  # what the worker sent right behind its answer
        self._inline = inline

    @property
    def takes_inline(self) -> bool:
        """The worker was handed the batch's take and waits for ``give_statuses``."""
        return self._inline

    @property
    def worker_handle(self) -> Handle:
        """The worker's handle, as its own supervisor would record it on a local backend."""
        return {"backend": "local", "pid": self.pid, "host": socket.gethostname(),
                "start_ticks": self.start_ticks}

    def answer(self, message: Mapping[str, Any]) -> None:
        """Answer the worker's request to record (``{"record": ...}``, see module)."""
        with contextlib.suppress(OSError):  # the worker went away: reading says so
            _send_line(self._sock, message)

    def give_statuses(self, statuses: Mapping[str, JobStatus] | None, handle: Handle,
                      why: str | None = None) -> None:
        """Tell a worker handed its take what ``set_handles`` recorded (``InlineTaking``);
        None: it runs nothing of the batch (*why* goes to its log)."""
        if not self._inline:
            raise RuntimeError("this worker was not handed a take")
        self._inline = False
        message: dict[str, Any] = {"error": why or "the claimer recorded no handle"} \
            if statuses is None else {"statuses": {k: str(v) for k, v in statuses.items()},
                                      "handle": dict(handle)}
        try:
            _send_line(self._sock, message)
        except OSError:
            pass  # the worker went away: reading the claim says so

    def read(self, timeout: float) -> tuple[dict[str, Any], bytes] | None:
        """The worker's next message about a batch and the bytes that follow it; None on
        timeout. ``{"done": true}`` ends the batch; a worker that went away reads as
        ``{"lost": true}``."""
        if self.done:
            return {"done": True}, b""
        deadline = time.monotonic() + max(timeout, 0.0)
        try:
            while (end := self._buf.find(b"\n")) < 0:
                self._fill(deadline)
            message = json.loads(bytes(self._buf[:end]))
            del self._buf[:end + 1]
            size = int(message.get("size") or 0)
            while len(self._buf) < size:
                self._fill(deadline + 60.0)  # the data follows its header at once
        except TimeoutError:
            return None
        except (OSError, ValueError):
            self.close()
            return {"lost": True}, b""
        data = bytes(self._buf[:size])
        del self._buf[:size]
        if message.get("done"):
            self.close()
        return message, data

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._sock.settimeout(left)
        chunk = self._sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the warm worker closed the connection")
        self._buf += chunk

    def wait(self, timeout: float) -> bool:
        """True once the worker says the job ended (or the worker is gone); False on timeout."""
        if self.done:
            return True
        self._sock.settimeout(max(timeout, 0.0001))
        try:
            _recv_line(self._sock, self._buf)
        except TimeoutError:
            return False
        except (OSError, ValueError):
            pass  # the worker died: the job's record (and the reaper) tell what happened
        self.close()
        return True

    def close(self) -> None:
        if not self.done:
            self.done = True
            self._sock.close()
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def claim_worker(directory: Path, request: Mapping[str, Any]) -> WarmClaim | None:
    """Hand *request* (``{"job", "env"}``, plus ``"batch"``: the names of a batch's jobs) to an
    idle worker of the pool, or return None when none is idle."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    for name in sorted(names):
        if not name.endswith(".claim"):
            continue
        pid = int(name.split(".")[0])
        try:
            lock = open(directory / name)  # noqa: SIM115 - held for the job's duration
        except FileNotFoundError:
            continue  # it retired meanwhile
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue  # busy with another client's job
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        received = bytearray()
        try:
            sock.settimeout(10)
            sock.connect(str(directory / f"{pid}.sock"))
            _send_line(sock, request)
            reply = _recv_line(sock, received)
        except (OSError, ValueError):
            sock.close()
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
            continue
        if reply.get("ok"):
            return WarmClaim(sock, lock, pid, reply.get("start_ticks"), bytes(received),
                             inline="take" in request and reply.get("take") == "inline")
        sock.close()
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    return None


@dataclass(frozen=True, slots=True)
class WarmRequest:
    """What a client handed over: one job, or a batch (``job`` then names the batch)."""

    job: str
    env: dict[str, str]
    batch: tuple[str, ...] = field(default=())
    take: HandedTake | None = None


def take_request(take: HandedTake) -> dict[str, Any]:
    """A batch's take as it travels in a hand-over request (``"take"``)."""
    return {"record": take.record.to_json(),
            "calls": base64.b64encode(take.calls).decode("ascii")}


def _handed_take(request: Mapping[str, Any]) -> HandedTake | None:
    given = request.get("take")
    if not isinstance(given, Mapping):
        return None
    return HandedTake(JobRecord.from_json(given["record"]),
                      base64.b64decode(given["calls"], validate=True))


class WarmEndpoint:
    """The worker's side: wait for the next job, say when it is done, retire when idle."""

    def __init__(self, directory: Path, *, run_dir: Path | None = None) -> None:
        self._dir = Path(directory)
        self._run_dir = run_dir
        self._pid = os.getpid()
        self._ticks: int | None = None
        self._server: socket.socket | None = None
        self._conn: socket.socket | None = None
        self._busy: IO[str] | None = None

    def open(self, *, busy: bool = False) -> WarmEndpoint:
        """Listen for clients. With *busy*, the worker's claim is held (clients skip it)
        until ``release()``: a worker still running its first job shows up at once, so a
        client that sees that job end finds the worker claimable instead of starting
        another one."""
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self._run_dir is not None:  # whose pool this is, when it lives outside the home
            owner = self._dir / OWNER_FILE
            with contextlib.suppress(OSError):
                if not owner.exists():
                    owner.write_text(str(self._run_dir))
        sock_path = self._dir / f"{self._pid}.sock"
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            server.bind(str(sock_path))
        finally:
            os.umask(old)
        server.listen(4)
        self._server = server
        claim = self._dir / f"{self._pid}.claim"
        if busy:  # locked before it is visible under its name: no client can claim it first
            tmp = self._dir / f".{self._pid}.claim.tmp"
            self._busy = open(tmp, "a")  # noqa: SIM115 - held until release()
            fcntl.flock(self._busy, fcntl.LOCK_EX)
            os.replace(tmp, claim)
        else:
            claim.touch()  # visible only once it listens
        return self

    def release(self) -> None:
        """Make the worker claimable (after ``open(busy=True)``); idempotent."""
        held, self._busy = self._busy, None
        if held is not None:
            self._idle_from_now()
            with contextlib.suppress(OSError):
                fcntl.flock(held, fcntl.LOCK_UN)
            held.close()

    def next_job(self, keep_alive: float, should_stop: Callable[[], bool] = lambda: False
                 ) -> WarmRequest | None:
        """Block until a client hands over a job; None once idle for *keep_alive* seconds, or
        when *should_stop* says so (a SIGTERM while idle retires the worker)."""
        if self._server is None:
            raise RuntimeError("endpoint is not open")
        deadline = time.monotonic() + keep_alive
        while True:
            left = deadline - time.monotonic()
            if should_stop():
                left = 0.0
            if left <= 0:
                if self._retire():
                    return None
                left = 1.0  # a client holds our claim and is about to connect
                deadline = time.monotonic() + left
            self._server.settimeout(min(left, 0.5))
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            try:
                conn.settimeout(10)
                request = _recv_line(conn)
                take = _handed_take(request) if request.get("batch") else None
                if self._ticks is None:
                    self._ticks = start_ticks(self._pid)
                reply: dict[str, Any] = {"ok": True, "pid": self._pid,
                                         "start_ticks": self._ticks}
                if take is not None:
                    reply["take"] = "inline"
                _send_line(conn, reply)
            except (OSError, ValueError, KeyError, TypeError):
                conn.close()
                continue
            self._conn = conn
            return WarmRequest(str(request["job"]), dict(request.get("env") or {}),
                               tuple(str(n) for n in request.get("batch") or ()), take)

    def take_statuses(self, timeout: float) -> tuple[dict[str, JobStatus], Handle] | None:
        """The claimer's word on a batch handed over with its take (see module): the
        statuses it recorded the handle with, and that handle; None when it could not (or
        went away, or said nothing for *timeout* seconds)."""
        if self._conn is None:
            return None
        try:
            self._conn.settimeout(timeout)
            message = _recv_line(self._conn)
            self._conn.settimeout(10)
        except (OSError, ValueError):
            return None
        if "statuses" not in message:
            sys.stderr.write(f"[shoal] warm worker pid {self._pid}: the claimer recorded no "
                             f"handle on the batch: {message.get('error')}\n")
            return None
        return ({str(k): JobStatus(v) for k, v in message["statuses"].items()},
                dict(message.get("handle") or {}))

    def record(self, changes: Sequence[Mapping[str, Any]], files: Mapping[str, bytes]
               ) -> list[bool] | None:
        """Have the claimer of a batch handed over with its take record *changes* (JSON of
        ``JobChange``) after storing *files* (see module): which were applied; None (why
        written to the worker's log) when it refused or went away: the worker then records
        through its stores, whose answer is the one that counts."""
        if self._conn is None:
            return None
        keys = list(files)
        data = b"".join(files[k] for k in keys)
        header = {"record": list(changes), "files": [[k, len(files[k])] for k in keys],
                  "size": len(data)}
        try:
            self._conn.settimeout(_RECORD_WAIT_S)
            self._conn.sendall(json.dumps(header).encode() + b"\n" + data)
            reply = _recv_line(self._conn)
            self._conn.settimeout(10)
        except (OSError, ValueError) as e:
            self._conn.close()
            self._conn = None
            sys.stderr.write(f"[shoal] warm worker pid {self._pid}: the claimer went away "
                             f"before recording the batch's changes: {e}\n")
            return None
        if "applied" not in reply:
            sys.stderr.write(f"[shoal] warm worker pid {self._pid}: the claimer did not "
                             f"record the batch's changes: {reply.get('error')}\n")
            return None
        return [bool(a) for a in reply["applied"]]

    def notify(self, message: Mapping[str, Any], data: bytes = b"") -> None:
        """Tell the client something about its batch (``message["size"]`` bytes follow)."""
        if self._conn is None:
            return
        try:
            self._conn.sendall(json.dumps({**message, "size": len(data)}).encode() + b"\n"
                               + data)
        except OSError:  # the client went away; its jobs carry on and are recorded
            self._conn.close()
            self._conn = None

    def job_done(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                _send_line(self._conn, {"done": True})
            self._conn.close()
            self._conn = None
        self._idle_from_now()

    def _idle_from_now(self) -> None:
        """The claim file's mtime says since when the worker is idle (``shoal workers``)."""
        with contextlib.suppress(OSError):
            os.utime(self._dir / f"{self._pid}.claim")

    def _retire(self) -> bool:
        claim = self._dir / f"{self._pid}.claim"
        with open(claim) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            claim.unlink()
            (self._dir / f"{self._pid}.sock").unlink(missing_ok=True)
        self.close()
        return True

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        (self._dir / f"{self._pid}.claim").unlink(missing_ok=True)
        self.release()
        (self._dir / f"{self._pid}.sock").unlink(missing_ok=True)
