"""Requests per warm ``@remote`` call through the team server, counted on the server.

``python server_requests.py [--calls N]`` (run from ``bench/``): ``shoal server``'s own app
(``server_config``, no tokens, a fresh home) runs on a thread of this process behind an ASGI
wrapper that counts and times each request; a client ``Session`` of that server calls
``_warm_module.trivial`` N times on one warm worker. Prints the requests per call by route,
each route's server time (p50) and the call's p50. Client and server share this process (and
its GIL), so the times are above ``server.py remote``'s: read the counts, and the times only
against each other.
"""

from __future__ import annotations

import argparse
import collections
import os
import socket
import statistics
import tempfile
import threading
import time
from typing import Any

from _warm_module import trivial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    n = parser.parse_args().calls
    for name in [k for k in os.environ if k.startswith("SHOAL_")]:
        del os.environ[name]
    os.environ["SHOAL_HOME"] = tempfile.mkdtemp(prefix="shoal-bench-server-")
    import uvicorn

    from shoal import RemoteExecutor
    from shoal.server.admin import server_config
    from shoal.session import Session

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = server_config(Session(server_url=None), host="127.0.0.1", port=port, auth=False)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    times: dict[str, list[float]] = collections.defaultdict(list)
    inner = config.app

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        path = scope["path"].removeprefix("/api/v1")
        path = "/launches/ID/messages" if path.endswith("/messages") else path
        counts[(scope["method"], path)] += 1
        t = time.perf_counter()
        await inner(scope, receive, send)
        times[path].append(time.perf_counter() - t)

    config.app = counted
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 60
    while not server.started:  # bounded: uvicorn sets it once it listens
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start within 60 s")
        time.sleep(0.01)
    client = Session(server_url=f"http://127.0.0.1:{port}", home=tempfile.mkdtemp())
    wall = []
    with RemoteExecutor(max_parallel_jobs=1, keep_alive_period_in_seconds=60,
                        sagemaker_session=client) as e:
        assert e.submit(trivial, 0).result(timeout=120) == 0  # starts the warm worker
        time.sleep(1)  # its start-up's requests are over
        counts.clear()
        times.clear()
        for i in range(n):
            t = time.perf_counter()
            assert e.submit(trivial, i).result(timeout=120) == i
            wall.append(time.perf_counter() - t)
        time.sleep(0.5)  # the last call's closing requests
        seen = dict(counts)
    print(f"{sum(seen.values()) / n:.2f} requests per warm call ({n} calls)")
    for (method, path), c in sorted(seen.items(), key=lambda kv: -kv[1]):
        print(f"  {c / n:5.2f}  {method} {path}  server p50 "
              f"{statistics.median(times[path]) * 1000:.2f} ms")
    print(f"call p50 {statistics.median(wall) * 1000:.2f} ms")
    client.close()
    server.should_exit = True


if __name__ == "__main__":
    main()
