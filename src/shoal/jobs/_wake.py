"""Waking a client that waits for a job on this host, instead of letting it poll.

A waiting client makes a file under ``SHOAL_HOME/run/wake/`` named after the job
(``w-<digest>-<pid>-<n>``) and binds a Unix datagram socket for it (on Linux in the abstract
namespace, named by a digest of the file's path, so a long home still fits the 108-byte
address; elsewhere the file is the socket) *before* it reads the job's record; whoever
records the job's end (its supervisor, or a client reaping it) sends one byte to the socket of
every such file of that job *after* the record is committed. So an end is either already on the record the client reads
first, or wakes it: no wake-up is lost. The client (``JobService._wait``) still reads the
record on a bounded backoff, which is all it has where no wake-up can come: a supervisor on
another host (Ray, a shared home), a platform without ``AF_UNIX``, or (off Linux) a home whose
path is too long for a socket address. A client that died leaves a file whose socket nobody
holds; the next sender removes it (``ECONNREFUSED``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import select
import socket
import sys
from pathlib import Path

__all__ = ["WakeChannel", "notify", "open_channel"]

#: sun_path holds 108 bytes on Linux, 104 on macOS; leave room for the terminating NUL.
_MAX_PATH = 100
_counter = itertools.count()
_ABSTRACT = sys.platform.startswith("linux")


def _address(marker: Path) -> str:
    """The socket address of a waiter's file."""
    if _ABSTRACT:
        return "\0shoal-wake/" + hashlib.sha256(os.fsencode(marker)).hexdigest()[:40]
    return os.fspath(marker)


def _prefix(job: str) -> str:
    return "w-" + hashlib.sha256(job.encode()).hexdigest()[:20] + "-"


class WakeChannel:
    """One waiting client's socket for one job."""

    def __init__(self, sock: socket.socket, path: Path) -> None:
        self._sock = sock
        self.path = path

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* seconds; True when woken (the job's end is recorded)."""
        ready, _, _ = select.select([self._sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        with contextlib.suppress(OSError):
            while self._sock.recv(16):  # drain: one end may be announced more than once
                pass
        return True

    def close(self) -> None:
        self._sock.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> WakeChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_channel(directory: Path, job: str) -> WakeChannel | None:
    """A bound socket to be woken through when *job* ends; None where none can be had."""
    if not hasattr(socket, "AF_UNIX"):
        return None
    path = directory / f"{_prefix(job)}{os.getpid()}-{next(_counter)}"
    if not _ABSTRACT and len(os.fsencode(path)) > _MAX_PATH:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # in the private home
        path.unlink(missing_ok=True)  # a dead client of the same pid left it
        sock.bind(_address(path))
        sock.setblocking(False)
        if _ABSTRACT:
            path.touch()  # bound first: a sender that finds the file finds the socket
    except OSError:
        sock.close()
        return None
    return WakeChannel(sock, path)


def notify(directory: Path, jobs: list[str] | tuple[str, ...]) -> None:
    """Wake every client waiting for one of *jobs* here (call it once their end is
    committed). Never raises: a wake-up is an optimisation over the client's polling."""
    prefixes = tuple(_prefix(job) for job in jobs)
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefixes)]
    except OSError:
        return
    if not names:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        for name in names:
            path = directory / name
            try:
                sock.sendto(b"1", _address(path))
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # its client is gone
            except OSError:
                pass  # its buffer is full: it has been woken already
