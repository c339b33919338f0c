"""EngineProcess's bookkeeping on the server's side (issue #19 item 6), over a real socket pair
standing in for the engine process's end: the queue limit counts requests sent that have no
token yet, a first token moves a request to live, a last one ends it, and a generation
cancelled meanwhile drops its later events without changing the counts twice."""

from __future__ import annotations

import multiprocessing.connection as mpc
import socket

import pytest

from shoal.errors import OverloadedError
from shoal.llm.serving._engine import TokenEvent
from shoal.llm.serving._engine_process import EngineProcess
from shoal.llm.serving._params import GenerationParams


def _event(gid: int, token: int, *, finish: str | None = None) -> tuple[object, ...]:
    return (gid, token, f"t{token}", -0.5, False, finish, "done" if finish else None, None,
            None)


@pytest.fixture()
def engine():
    ours, theirs = socket.socketpair()
    process = EngineProcess(max_queue=2)
    process._conn = mpc.Connection(ours.detach())
    other = mpc.Connection(theirs.detach())
    yield process, other
    process._conn.close()
    other.close()


def test_counts_follow_the_events_and_a_cancel_drops_what_comes_after(engine):
    process, other = engine
    got: dict[int, list[TokenEvent]] = {1: [], 2: []}
    g1 = process.submit([5, 6], GenerationParams(max_new_tokens=3), got[1].append)
    g2 = process.submit([7], GenerationParams(max_new_tokens=3), got[2].append)
    assert other.recv() == ("submit", g1.id, [5, 6], GenerationParams(max_new_tokens=3))
    assert other.recv()[:3] == ("submit", g2.id, [7])
    assert (process.queue_depth, process.live) == (2, 0)
    with pytest.raises(OverloadedError, match="job_queue_size=2"):
        process.submit([8], GenerationParams(), lambda e: None)

    process._deliver([_event(g1.id, 10)])
    assert (process.queue_depth, process.live) == (1, 1)
    assert [e.text for e in got[1]] == ["t10"]

    g1.cancel()
    assert other.recv() == ("cancel", g1.id)
    assert (process.queue_depth, process.live) == (1, 0)
    process._deliver([_event(g1.id, 11, finish="length"), _event(g2.id, 20)])
    assert [e.text for e in got[1]] == ["t10"]  # dropped: it was cancelled
    assert (process.queue_depth, process.live) == (0, 1)

    process._deliver([_event(g2.id, 21, finish="eos_token")])
    assert (process.queue_depth, process.live) == (0, 0)
    last = got[2][-1]
    assert last.finish == "eos_token" and last.generated_text == "done"
    g2.cancel()  # finished: nothing is sent
    other_sock = socket.socket(fileno=other.fileno())
    other_sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        other_sock.recv(1, socket.MSG_PEEK)
    other_sock.detach()


def test_a_sampling_request_gets_its_seed_here(engine):
    process, other = engine
    g = process.submit([1], GenerationParams(do_sample=True), lambda e: None)
    sent = other.recv()[3]
    assert g.seed is not None and sent.seed == g.seed
    fixed = process.submit([1], GenerationParams(do_sample=True, seed=7), lambda e: None)
    assert fixed.seed == 7 and other.recv()[3].seed == 7
