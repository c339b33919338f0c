"""``Predictor`` direct to an endpoint's model server vs through the team server's
``POST /api/v1/endpoints/{name}/invocations``, for bench/server.py.

One ``shoal server`` (tokens on) runs the endpoint (a 4→2 linear ONNX model, one instance)
on this host. The same process times both sides in interleaved rounds (direct first in even
rounds, the proxy first in odd ones): the direct ``Predictor`` reads the record from the
server's own home (it is on this host) and posts to the model server's address; the proxied
one has only the server's URL and a token. Each side's p50 per round, the ratio beside it.
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

import numpy as np
from _common import scratch
from _servers import shoal_token, start_shoal

__all__ = ["run_invoke_bench"]


def _linear_onnx(path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    b = np.zeros(2, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "B"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def _p50(call: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_invoke_bench(args: argparse.Namespace, header: Callable[[str], None]) -> None:
    import shoal
    from shoal.model import Model
    from shoal.predictor import Predictor

    header(f"Predictor direct vs through the server: {args.calls} calls per side per round, "
           f"{args.rounds} rounds")
    tmp = Path(tempfile.mkdtemp(prefix="server-invoke-", dir=scratch()))
    server = None
    sessions: list[Any] = []
    try:
        home = tmp / "server"
        token = shoal_token(home)
        server = start_shoal(home)
        model = tmp / "model"
        model.mkdir()
        _linear_onnx(model / "model.onnx")
        client = shoal.Session(server_url=server.url, token=token, home=tmp / "client")
        direct = shoal.Session(home=home)  # the record, read where the server keeps it
        sessions += [client, direct]
        proxied = Model(model_data=str(model), sagemaker_session=client).deploy(
            endpoint_name="bench-invoke")
        straight = Predictor("bench-invoke", sagemaker_session=direct)
        x = [[1.0, 2.0, 3.0, 4.0]]
        assert proxied.predict(x) == straight.predict(x)
        for p in (proxied, straight):  # warm: connections open, the record read
            for _ in range(20):
                p.predict(x)
        rows = []
        for r in range(args.rounds):
            order = [("direct", straight), ("proxy", proxied)]
            if r % 2:
                order.reverse()
            got = {name: _p50(lambda p=p: p.predict(x), args.calls) for name, p in order}
            rows.append(got)
            print(f"round {r + 1}: direct p50 {got['direct'] * 1e3:.2f} ms, through the "
                  f"server {got['proxy'] * 1e3:.2f} ms, ratio {got['proxy'] / got['direct']:.2f}")
        d = statistics.median(row["direct"] for row in rows)
        p = statistics.median(row["proxy"] for row in rows)
        print(f"median of rounds: direct p50 {d * 1e3:.2f} ms, through the server p50 "
              f"{p * 1e3:.2f} ms, ratio {p / d:.2f} (+{(p - d) * 1e3:.2f} ms per call)")
        proxied.delete_endpoint()
    finally:
        for s in sessions:
            s.close()
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
