"""The client's side of a warm pool's hand-over (``backends/_warm.py``), over real sockets.

A worker that ends a tiny job or batch at once sends its answer to the hand-over and its news
about the job right behind it: the client reads them in one chunk and must keep what follows
the answer. (It once dropped the claim instead: the worker ran the jobs, the client called it
busy and started another worker; on Ray the extra warm actor then waited for the CPUs of the
idle ones until their keep-alive ran out, the 0.02x bench outliers.)
"""

from __future__ import annotations

import fcntl
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.backends._warm import claim_worker
from shoal.backends.rundir import private_socket_dir

PID = 4242
NEWS = {"jobs": [["job-a", "completed", [3]]], "size": 3}


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Path]:
    # AF_UNIX paths are short (108 bytes): under the private socket dir, as pool_dir does.
    path = private_socket_dir() / "test-warm-claims" / tmp_path.name
    path.mkdir(parents=True, exist_ok=True)
    yield path
    for f in path.iterdir():
        f.unlink()
    path.rmdir()


@pytest.fixture
def worker(pool: Path) -> Iterator[dict]:
    """A worker of *pool* that answers a hand-over and, in the same write, everything it has
    to say about the job (set ``said`` before claiming); ``request`` is what it was handed."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(pool / f"{PID}.sock"))
    server.listen(1)
    (pool / f"{PID}.claim").touch()
    state: dict = {"said": b""}

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            buf = b""
            while not buf.endswith(b"\n"):
                buf += conn.recv(65536)
            state["request"] = json.loads(buf)
            answer = json.dumps({"ok": True, "pid": PID, "start_ticks": 7}).encode() + b"\n"
            conn.sendall(answer + state["said"])
            conn.recv(1)  # until the client closes its end

    thread = threading.Thread(target=serve, daemon=True)
    state["start"] = thread.start
    yield state
    server.close()
    thread.join(timeout=10)


def _lock_is_free(pool: Path) -> bool:
    with open(pool / f"{PID}.claim") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_a_batch_reported_right_behind_the_answer_is_read_in_full(pool, worker):
    worker["said"] = (json.dumps(NEWS).encode() + b"\n" + b"\x80\x05K" + b'{"done": true}\n')
    worker["start"]()
    claim = claim_worker(pool, {"job": "batch-1", "env": {}, "batch": ["job-a"]})
    assert claim is not None, "the worker took the batch, yet the client gave up its claim"
    assert worker["request"]["batch"] == ["job-a"]
    assert (claim.pid, claim.start_ticks) == (PID, 7)
    assert not _lock_is_free(pool)  # held while the batch runs
    assert claim.read(5.0) == (NEWS, b"\x80\x05K")
    assert claim.read(5.0) == ({"done": True}, b"")
    assert claim.done and _lock_is_free(pool)


def test_a_job_ended_right_behind_the_answer_is_seen_ended(pool, worker):
    worker["said"] = b'{"done": true}\n'
    worker["start"]()
    claim = claim_worker(pool, {"job": "job-b", "env": {}})
    assert claim is not None, "the worker took the job, yet the client gave up its claim"
    assert claim.wait(5.0) is True
    assert claim.done and _lock_is_free(pool)


def test_an_answer_read_alone_still_claims_the_worker(pool, worker):
    worker["start"]()
    claim = claim_worker(pool, {"job": "job-c", "env": {}})
    assert claim is not None
    assert claim.wait(0.05) is False  # nothing said yet: the job runs
    claim.close()
    assert _lock_is_free(pool)
