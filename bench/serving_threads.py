"""Where a model server request's CPU goes, by thread (issue #16 item 1): one worker with one
onnxruntime intra-op thread (so onnxruntime runs on the inference thread), under
bench/serving.py's load (c=32, one MNIST image a request as x-npy); the CPU of the server's main
thread (the event loop: uvicorn's HTTP and the ASGI app) and of its other threads (the
inference thread and onnxruntime) over a window of the load, per request, with the load
generator's.

    OMP_NUM_THREADS=1 .venv/bin/python bench/serving_threads.py [--rounds 3] [--seconds 8]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import serving as bench  # noqa: E402
from _common import cpu_model, scratch  # noqa: E402

LOOP, OTHERS = "event loop (main thread)", "inference thread + onnxruntime"


def by_thread(pid: int) -> dict[str, float]:
    """CPU seconds so far of *pid*'s main thread and of all its other threads."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {LOOP: 0.0, OTHERS: 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        out[LOOP if task.name == str(pid) else OTHERS] += (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    import numpy as np
    import torch

    from shoal.export.onnx import export

    work = Path(tempfile.mkdtemp(prefix="shoal-bench-threads-", dir=scratch()))
    try:
        model_dir = work / "mnist"
        export(bench.mnist_cnn(), torch.randn(1, 1, 28, 28), model_dir / "model.onnx")
        buf = io.BytesIO()
        np.save(buf, np.random.default_rng(1).random((1, 1, 28, 28), dtype=np.float32))
        body = work / "body.npy"
        body.write_bytes(buf.getvalue())
        # the load generator warms up for 2 s; the window is the middle of the measured part
        window = max(1.0, args.seconds - 4.0)
        for r in range(args.rounds):
            port = bench._free_port()
            proc, _ = bench.start(bench.shoal_cmd(model_dir, port, ["--workers", "1"]), port,
                                  env=dict(os.environ, SHOAL_ORT_INTRA_OP_THREADS="1"))
            try:
                result: dict = {}

                def drive(result: dict = result, port: int = port, pid: int = proc.pid) -> None:
                    result.update(bench.run_load(port, body, "application/x-npy", 32,
                                                 args.seconds, pid))

                load = threading.Thread(target=drive)
                load.start()
                time.sleep(3.5)  # a bounded wait into the measured part of the load
                before, t0 = by_thread(proc.pid), time.perf_counter()
                time.sleep(window)
                after, elapsed = by_thread(proc.pid), time.perf_counter() - t0
                load.join()
            finally:
                bench.stop(proc)
            n = result["rps"] * elapsed
            split = {k: (after[k] - before[k]) / n * 1e6 for k in after}
            print(f"round {r + 1} ({cpu_model()}, load average {os.getloadavg()[0]:.1f}): "
                  f"{result['rps']:.0f} req/s; CPU a request: {OTHERS} {split[OTHERS]:.0f} us, "
                  f"{LOOP} {split[LOOP]:.0f} us, load generator {result['client_us']:.0f} us",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
