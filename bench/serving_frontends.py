"""HTTP front ends for the model server side by side (issue #16 item 1): the same shoal app
on uvicorn + httptools (uvloop and stdlib asyncio), uvicorn + h11 (pure Python) and granian
(Rust, ASGI), with 1 and 2 worker processes (``FRONTEND:WORKERS``), under bench/serving.py's load (c=32 keep-alive
connections, one MNIST image a request as ``application/x-npy``, a separate load-generator
process). Configurations alternate within each round, so a machine that speeds up or slows
down moves all of them; the anchor is today's server with its old default (one worker), and
the in-process onnxruntime ceiling is measured before and after.

    OMP_NUM_THREADS=1 .venv/bin/python bench/serving_frontends.py [--rounds 3] [--seconds 6]
        [--configs shoal:1,shoal:2,granian-asgi:2,...]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import serving as bench  # noqa: E402
from _common import cpu_model, scratch  # noqa: E402

SERVER = Path(__file__).with_name("_frontend_server.py")
DEFAULT = "shoal:1,shoal:2,uvicorn-asyncio:2,granian-asgi:1,granian-asgi:2"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--configs", default=DEFAULT)
    args = parser.parse_args()

    import shutil

    import numpy as np
    import torch

    from shoal.export.onnx import export

    work = Path(tempfile.mkdtemp(prefix="shoal-bench-frontends-", dir=scratch()))
    try:
        model_dir = work / "mnist"
        export(bench.mnist_cnn(), torch.randn(1, 1, 28, 28), model_dir / "model.onnx")
        buf = io.BytesIO()
        np.save(buf, np.random.default_rng(1).random((1, 1, 28, 28), dtype=np.float32))
        body = work / "body.npy"
        body.write_bytes(buf.getvalue())
        configs = [tuple(c.split(":")) for c in args.configs.split(",")]
        print(f"{cpu_model()}; load average {os.getloadavg()[0]:.2f}", flush=True)
        _, before, _, per_cpu_before = bench.ceiling(model_dir / "model.onnx", 1.0)
        results: dict[tuple[str, ...], list[dict]] = {c: [] for c in configs}
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for frontend, workers in order:
                port = bench._free_port()
                cmd = [sys.executable, str(SERVER), frontend, str(model_dir), str(port), workers]
                proc, _ = bench.start(cmd, port, env=dict(os.environ,
                                                          SHOAL_BENCH_FRONTEND=frontend))
                try:
                    res = bench.run_load(port, body, "application/x-npy", 32, args.seconds,
                                         proc.pid)
                finally:
                    bench.stop(proc)
                results[(frontend, workers)].append(res)
                print(f"  round {r + 1} {frontend:16s} workers {workers}: {res['rps']:6.0f} req/s"
                      f"  p50 {res['p50_ms']:5.2f} ms  errors {res['errors']}  CPU a request: "
                      f"server {res['server_us']:.0f} + load generator {res['client_us']:.0f} us"
                      f"  (load {os.getloadavg()[0]:.1f})", flush=True)
        _, after, _, per_cpu_after = bench.ceiling(model_dir / "model.onnx", 1.0)
        ceiling, per_cpu = max(before, after), max(per_cpu_before, per_cpu_after)
        anchor = statistics.median(r["rps"] for r in results[configs[0]])
        print(f"\n{cpu_model()}; load average {os.getloadavg()[0]:.2f}; in-process ceiling "
              f"{ceiling:.0f} samples/s (before {before:.0f}, after {after:.0f}), at most "
              f"{per_cpu:.0f} samples per CPU-second; medians of {args.rounds} rounds")
        for cfg, rs in results.items():
            rps = statistics.median(r["rps"] for r in rs)
            cpu = statistics.median(r["server_us"] + r["client_us"] for r in rs)
            print(f"  {cfg[0]:16s} workers {cfg[1]}: {rps:6.0f} req/s = {rps / anchor:.2f}x "
                  f"{configs[0][0]}:{configs[0][1]}, {rps / ceiling:.0%} of the ceiling by wall "
                  f"clock, {1e6 / cpu / per_cpu:.0%} per CPU-second ({cpu:.0f} us a request), "
                  f"p50 {statistics.median(r['p50_ms'] for r in rs):.2f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
