"""What an endpoint's one address costs (issue #16): two model-server instances sharing one
port (``--reuse-port``, as a local endpoint's instances do) against the same two instances
on ports of their own, each driven directly.

    .venv/bin/python bench/endpoint_url.py [--seconds 8] [--rounds 3] [--concurrency 32]

The model and the load generator are bench/serving.py's (the MNIST CNN as ONNX, one image a
request as ``application/x-npy``, keep-alive HTTP/1.1 from a separate process). Shared: one
load generator with ``--concurrency`` connections to the one port. Direct: two load
generators at the same time, half the connections each, one per instance's port. Rounds
alternate; medians are reported. Both layouts' servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from _common import cpu_model, scratch
from serving import _free_port, _ping, mnist_cnn, run_load, shoal_cmd, stop


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


def _load(ports: list[int], body: Path, procs: list[subprocess.Popen], concurrency: int,
          seconds: float) -> dict[str, float]:
    targets = sorted(set(ports))
    results: list[dict] = [{} for _ in targets]

    def one(i: int) -> None:
        results[i] = run_load(targets[i], body, "application/x-npy",
                              concurrency // len(targets), seconds, procs[i].pid)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"rps": sum(r["rps"] for r in results),
            "p50_ms": statistics.mean(r["p50_ms"] for r in results),
            "errors": sum(r["errors"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
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
                    got[shared].append(_load(ports, body, procs, args.concurrency,
                                             args.seconds))
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
