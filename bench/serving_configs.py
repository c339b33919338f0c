"""Interleaved configurations of the model server under bench/serving.py's load (c=32, x-npy,
the MNIST CNN): req/s, p50 and CPU a request for each, to compare settings in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/serving_configs.py \\
        '[{}, {"args": ["--workers", "2"]}, {"env": {"SHOAL_ORT_INTRA_OP_THREADS": "1"}}]' [SECONDS]

Each configuration is ``{"args": [flags for python -m shoal.serving], "env": {...}}``. No
anchor here: bench/serving.py measures the ceiling and the naive server.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import serving as bench  # noqa: E402
from _common import cpu_model, scratch  # noqa: E402


def main() -> None:
    import numpy as np
    import torch

    from shoal.export.onnx import export

    configs = json.loads(sys.argv[1]) if len(sys.argv) > 1 else [{}]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    work = Path(tempfile.mkdtemp(prefix="shoal-bench-configs-", dir=scratch()))
    atexit.register(shutil.rmtree, work, True)
    model_dir = work / "mnist"
    export(bench.mnist_cnn(), torch.randn(1, 1, 28, 28), model_dir / "model.onnx")
    buf = io.BytesIO()
    np.save(buf, np.random.default_rng(1).random((1, 1, 28, 28), dtype=np.float32))
    body = work / "body.npy"
    body.write_bytes(buf.getvalue())
    print(f"{cpu_model()}; load average {os.getloadavg()[0]:.2f}", flush=True)
    for cfg in configs:
        port = bench._free_port()
        proc, _ = bench.start(bench.shoal_cmd(model_dir, port, cfg.get("args", [])), port,
                              env=dict(os.environ, **cfg.get("env", {})))
        try:
            r = bench.run_load(port, body, "application/x-npy", 32, seconds, proc.pid)
        finally:
            bench.stop(proc)
        print(f"{json.dumps(cfg)}: {r['rps']:.0f} req/s, p50 {r['p50_ms']:.2f} ms, CPU a request:"
              f" server {r['server_us']:.0f} us + load generator {r['client_us']:.0f} us",
              flush=True)


if __name__ == "__main__":
    main()
