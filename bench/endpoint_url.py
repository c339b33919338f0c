"""What an endpoint's one address costs (issue #16): two model-server instances sharing one
port (``--reuse-port``, as a local endpoint's instances do) against the same two instances
on ports of their own, each driven directly.

    .venv/bin/python bench/endpoint_url.py [--seconds 8] [--rounds 3] [--concurrency 32]

The model and the load generator are bench/serving.py's (the MNIST CNN as ONNX, one image a
request as ``application/x-npy``, keep-alive HTTP/1.1 from one separate process). Shared:
``--concurrency`` connections to the one port. Direct: the same load generator process, half
the connections to each instance's port (what a client that round-robins over the instances
gets at best). Rounds alternate; medians are reported. Both layouts' servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import cpu_model, scratch
from serving import _client, _free_port, _ping, _request, mnist_cnn, shoal_cmd, stop


def _start_pair(model_dir: Path, work: Path, *, shared: bool) -> tuple[list[subprocess.Popen],
                                                                       list[int]]:
    ports = [_free_port()] * 2 if shared else [_free_port(), _free_port()]
    procs = []
    for i, port in enumerate(ports):
        extra = ["--reuse-port", "--port-file", str(work / f"ready-{i}")] if shared else []
        (work / f"ready-{i}").unlink(missing_ok=True)
        procs.append(subprocess.Popen(shoal_cmd(model_dir, port, extra),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 120
    while not (all(_ping(p) for p in ports)
               and (not shared or all((work / f"ready-{i}").exists() for i in range(2)))):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                stop(p)
            raise RuntimeError("the model servers did not start")
        time.sleep(0.02)  # bounded wait for servers this bench started
    return procs, ports


async def _drive(ports: list[int], body: bytes, concurrency: int, seconds: float) -> dict:
    """*concurrency* keep-alive connections spread evenly over *ports*."""
    targets = [ports[i % len(ports)] for i in range(concurrency)]
    requests = {p: _request(p, body, "application/x-npy") for p in set(ports)}
    errors: list[int] = []
    warm_end = time.perf_counter() + min(2.0, seconds / 5)
    await asyncio.gather(*(_client(p, requests[p], warm_end, [], errors) for p in targets))
    errors.clear()
    latencies: list[float] = []
    start = time.perf_counter()
    await asyncio.gather(*(_client(p, requests[p], start + seconds, latencies, errors)
                           for p in targets))
    elapsed = time.perf_counter() - start
    latencies.sort()
    n = len(latencies)
    return {"rps": n / elapsed, "p50_ms": latencies[n // 2] * 1e3, "errors": len(errors)}


def _load(ports: list[int], body: Path, concurrency: int, seconds: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--client", json.dumps(
        {"ports": ports, "body": str(body), "concurrency": concurrency, "seconds": seconds})],
        capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def client_main(spec: dict) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    body = Path(spec["body"]).read_bytes()
    print(json.dumps(asyncio.run(_drive(spec["ports"], body, spec["concurrency"],
                                        spec["seconds"]))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(json.loads(args.client))
        return
    import numpy as np
    import torch

    from shoal.export.onnx import export

    work = Path(tempfile.mkdtemp(prefix="shoal-bench-url-", dir=scratch()))
    try:
        model_dir = work / "mnist"
        export(mnist_cnn(), torch.randn(1, 1, 28, 28), model_dir / "model.onnx")
        buf = io.BytesIO()
        np.save(buf, np.random.default_rng(1).random((1, 1, 28, 28), dtype=np.float32))
        body = work / "body.npy"
        body.write_bytes(buf.getvalue())
        got: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for r in range(args.rounds):
            for shared in ((True, False) if r % 2 == 0 else (False, True)):
                procs, ports = _start_pair(model_dir, work, shared=shared)
                try:
                    got[shared].append(_load(ports, body, args.concurrency, args.seconds))
                finally:
                    for p in procs:
                        stop(p)
        print(f"CPU: {cpu_model()}; 2 instances, c={args.concurrency}, {args.rounds} rounds "
              f"of {args.seconds:g} s")
        med = {k: {m: statistics.median(x[m] for x in v) for m in ("rps", "p50_ms", "errors")}
               for k, v in got.items()}
        for shared, label in ((False, "direct, a port per instance"),
                              (True, "one URL, shared port     ")):
            m = med[shared]
            print(f"{label}: {m['rps']:8.0f} req/s  p50 {m['p50_ms']:6.2f} ms  "
                  f"errors {m['errors']:.0f}")
        print(f"one URL / direct: {med[True]['rps'] / med[False]['rps']:.2f}x throughput, "
              f"{med[True]['p50_ms'] / med[False]['p50_ms']:.2f}x p50")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
