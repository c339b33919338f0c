"""Calls to a Ray cluster that may have lost its head, bounded in time.

With the head's GCS gone, Ray's own calls (``ray.init``, ``ray.get_actor``) retry for minutes
and, in a connected driver, end the process after ``gcs_rpc_server_reconnect_timeout_s``
("The program will terminate"). A client of shoal must instead learn within seconds that the
cluster does not answer (``BackendUnavailableError`` naming its address), carry on with what
the stores hold, and be able to try again later. So: the GCS port is probed before
connecting; each liveness call runs in a thread of its own with a deadline (one at a time:
while one hangs, the next fails at once); and the client's own driver is told to outlive a
head that is away (its calls are bounded here instead).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

from shoal.errors import BackendUnavailableError

__all__ = ["CALL_TIMEOUT_S", "bounded", "outlive_head", "probe_address"]

T = TypeVar("T")
#: How long a liveness call may take before the cluster counts as not answering.
CALL_TIMEOUT_S = 5.0
_PROBE_TIMEOUT_S = 3.0
#: The client's driver waits this long for a head that went away (Ray's default: 60 s, then
#: it exits the process); liveness calls are bounded by CALL_TIMEOUT_S meanwhile.
_DRIVER_RECONNECT_S = "86400"
_stuck = threading.Lock()


def outlive_head() -> None:
    """Before ``ray.init`` in a client: never end this process when the head goes away."""
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", _DRIVER_RECONNECT_S)


def probe_address(address: str) -> None:
    """BackendUnavailableError at once when nothing listens at a ``host:port`` or
    ``ray://host:port`` address (``auto`` is left to Ray)."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or "/" in rest:
        return
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)),
                                      timeout=_PROBE_TIMEOUT_S):
            return
    except OSError as e:
        raise BackendUnavailableError(
            f"the Ray cluster at {address!r} does not answer ({e}): its head is down or "
            "unreachable. The records in the metadata store are still readable; try again "
            "once the head is back ('shoal ray up' starts one)", address=address) from e


def bounded(address: str, what: str, call: Callable[[], T],
            timeout: float = CALL_TIMEOUT_S) -> T:
    """*call*'s result, or BackendUnavailableError when it takes longer than *timeout* (or
    an earlier bounded call still hangs)."""
    if not _stuck.acquire(blocking=False):
        raise BackendUnavailableError(
            f"the Ray cluster at {address!r} is not answering (an earlier call is still "
            f"waiting for it), so {what} is unknown for now; try again later",
            address=address)
    values: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            values.append(call())
        except BaseException as e:  # handed to the caller's thread
            errors.append(e)
        finally:
            _stuck.release()

    worker = threading.Thread(target=run, daemon=True, name="shoal-ray-call")
    try:
        worker.start()
    except BaseException:
        _stuck.release()
        raise
    worker.join(timeout)
    if worker.is_alive():
        raise BackendUnavailableError(
            f"the Ray cluster at {address!r} did not answer within {timeout:g} s, so {what} "
            "is unknown for now: its head may be down. The records in the metadata store are "
            "still readable; try again once it answers", address=address)
    if errors:
        raise errors[0]
    return values[0]
