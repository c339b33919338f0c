"""Warm trivial ``@remote`` through the team server vs the embedded warm path, and a
``RemoteExecutor.map`` of N calls through the server vs embedded, for bench/server.py.

Both sides run in this process, in interleaved rounds (embedded first in even rounds, the
server first in odd ones), each on its own warm workers: the embedded side on a home of its
own (local processes, SQLite), the server side through ``shoal server`` (tokens on) whose
backend runs the warm workers on this host. The server's access log is off, as a team runs it.
The function called is ``_warm_module.trivial``: a user's module, pickled by reference.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import scratch, stop_background
from _servers import shoal_token, start_shoal

# The function lives in a module that imports nothing (as warm.py's second one): each job
# imports its module again, and this module's own imports (subprocess, urllib.request, ...
# through _servers) cost ~12 ms a call (docs/performance.md, "Team server").
from _warm_module import trivial

__all__ = ["run_remote_bench"]


class _Side:
    """One warm ``RemoteExecutor`` for round trips and one for ``map`` on *session*."""

    def __init__(self, session: Any) -> None:
        from shoal import RemoteExecutor

        self.session = session
        self.one = RemoteExecutor(max_parallel_jobs=1, keep_alive_period_in_seconds=300,
                                  sagemaker_session=session)
        self.many = RemoteExecutor(max_parallel_jobs=2, keep_alive_period_in_seconds=300,
                                   sagemaker_session=session)
        assert list(self.one.map(trivial, range(5))) == list(range(5))  # start the warm worker
        assert list(self.many.map(trivial, range(20))) == list(range(20))

    def round_trips(self, calls: int) -> list[float]:
        times = []
        for i in range(calls):
            t = time.perf_counter()
            assert self.one.submit(trivial, i).result(timeout=120) == i
            times.append(time.perf_counter() - t)
        return times

    def map_rate(self, n: int) -> float:
        t = time.perf_counter()
        assert list(self.many.map(trivial, range(n))) == list(range(n))
        return n / (time.perf_counter() - t)

    def close(self) -> None:
        for e in (self.one, self.many):
            e.shutdown()


def run_remote_bench(args: argparse.Namespace, header: Callable[[str], None]) -> None:
    import shoal

    tmp = Path(tempfile.mkdtemp(prefix="server-remote-", dir=scratch()))
    server = None
    sides: dict[str, _Side] = {}
    try:
        token = shoal_token(tmp / "server")
        server = start_shoal(tmp / "server")
        embedded = shoal.Session(home=str(tmp / "embedded"))
        remote = shoal.Session(home=str(tmp / "client"), server_url=server.url, token=token)
        sides = {"embedded": _Side(embedded), "server": _Side(remote)}
        trips: dict[str, list[float]] = {"embedded": [], "server": []}
        rates: dict[str, list[float]] = {"embedded": [], "server": []}
        for r in range(args.rounds):
            order = ["embedded", "server"] if r % 2 == 0 else ["server", "embedded"]
            for name in order:
                trips[name] += sides[name].round_trips(args.calls)
            for name in order:
                rates[name].append(sides[name].map_rate(args.map))
        e50, s50 = (statistics.median(trips[k]) for k in ("embedded", "server"))
        er, sr = (statistics.median(rates[k]) for k in ("embedded", "server"))
        header(f"rounds={args.rounds}, {args.calls} round trips and one map of {args.map:,} "
               "per side per round")
        print(f"warm trivial call p50: embedded {e50 * 1e3:7.2f} ms | through the server "
              f"{s50 * 1e3:7.2f} ms | ratio {s50 / e50:.2f}x (target <= 2x)")
        print(f"map of {args.map:,} trivial calls: embedded {er:7.0f} jobs/s | through the "
              f"server {sr:7.0f} jobs/s | server/embedded {sr / er:.2f} (target >= 0.5)")
    finally:
        for side in sides.values():
            side.close()
        if "embedded" in sides:
            stop_background(sides["embedded"].session)
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
