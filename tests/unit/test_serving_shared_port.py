"""A model server sharing its port (``--reuse-port``, an endpoint's instances): every socket
binds with SO_REUSEPORT and none listens before its model is loaded; the port file is written
only once every worker has its model. Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from shoal.serving._run import WorkerReadiness, bind_shared


def test_shared_sockets_join_one_port_and_take_no_connection_before_listening() -> None:
    first = bind_shared("127.0.0.1", 0, 2)
    port = first[0].getsockname()[1]
    other = bind_shared("127.0.0.1", port, 1)  # another server joins the same port
    try:
        assert {s.getsockname()[1] for s in first + other} == {port}
        with pytest.raises(ConnectionRefusedError):  # bound, none listening: not loaded yet
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        other[0].listen(8)  # what uvicorn does once that server's model is loaded
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        for s in first + other:
            s.close()


def test_the_port_file_is_written_once_every_worker_has_its_model(tmp_path: Path) -> None:
    ready = tmp_path / "instance.port"
    flags = bytearray(2)
    workers = [WorkerReadiness(flags, i, shared=True, ready_file=str(ready), port=8123)
               for i in range(2)]
    assert all(w.listen_when_loaded for w in workers)  # even the first: none answers 503
    workers[1].mark_ready()
    assert not ready.exists()
    workers[0].mark_ready()
    assert ready.read_text().strip() == "8123"
    assert not WorkerReadiness(bytearray(2), 0).listen_when_loaded  # unshared: as before
