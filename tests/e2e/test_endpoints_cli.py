"""``shoal endpoints`` and ``shoal serve`` end to end, as subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import shoal
from helpers import wait_until
from shoal.endpoints import EndpointService
from shoal.model import Model

CLI = [sys.executable, "-m", "shoal.cli"]
W = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.5, -1.0]], dtype=np.float32)
B = np.array([0.25, -0.5], dtype=np.float32)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ), stdin=subprocess.DEVNULL)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], proc.stderr


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    d = tmp_path_factory.mktemp("onnx-model")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"])],
        "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (d / "model.onnx").write_bytes(model.SerializeToString())
    return d


@pytest.fixture
def session(clean_env: Path) -> Iterator[shoal.Session]:
    s = shoal.Session(home=str(clean_env), launcher_idle_seconds=60)  # SHOAL_HOME of the CLI
    yield s
    try:
        for record in s.metadata.list_endpoints():
            EndpointService.for_session(s).delete(record.name)
    finally:
        s.backend.shutdown_launcher()
        s.close()


def test_list_describe_invoke_delete(session, onnx_dir, tmp_path):
    Model(model_data=onnx_dir, sagemaker_session=session).deploy(endpoint_name="cli-linear",
                                                      initial_instance_count=2)
    listed = run_cli("endpoints", "list")
    assert listed.returncode == 0, listed.stderr
    assert "cli-linear" in listed.stdout and "InService" in listed.stdout
    assert "2/2 in service" in listed.stdout
    [data] = json.loads(run_cli("endpoints", "list", "--json").stdout)
    assert data["name"] == "cli-linear" and len(data["instances"]) == 2

    described = run_cli("endpoints", "describe", "cli-linear")
    assert described.returncode == 0, described.stderr
    for needle in ("InService", str(onnx_dir), "Instances", "http://127.0.0.1:"):
        assert needle in described.stdout, described.stdout
    as_json = json.loads(run_cli("endpoints", "describe", "cli-linear", "--json").stdout)
    assert as_json["logs_uri"].endswith("endpoints/cli-linear/logs")
    # Both instances share the endpoint's one address, which describe shows.
    [url] = as_json["urls"]
    assert {i["url"] for i in as_json["instances"]} == {url}
    assert f"{url}/invocations" in described.stdout

    invoked = run_cli("endpoints", "invoke", "cli-linear", "--body", "[[1, 2, 3, 4]]")
    assert invoked.returncode == 0, invoked.stderr
    assert np.allclose(json.loads(invoked.stdout), np.array([[1, 2, 3, 4]]) @ W + B)
    body = tmp_path / "rows.csv"
    body.write_text("0,0,0,0\n1,0,0,0\n")
    csv_out = run_cli("endpoints", "invoke", "cli-linear", "--body", f"@{body}",
                      "--content-type", "text/csv", "--accept", "text/csv")
    assert csv_out.returncode == 0, csv_out.stderr
    rows = [[float(v) for v in line.split(",")] for line in csv_out.stdout.split()]
    assert np.allclose(rows, np.array([[0, 0, 0, 0], [1, 0, 0, 0]]) @ W + B)

    bad = run_cli("endpoints", "invoke", "cli-linear", "--body", "[[1, 2]]")
    assert bad.returncode == 6
    assert_one_line_error(bad, "'cli-linear' answered 4")
    # The server's explanation (its "detail"), not only its one-word "error".
    refused = run_cli("endpoints", "invoke", "cli-linear", "--body", "[[1, 2, 3, 4]]",
                      "--accept", "text/x-nothing")
    assert refused.returncode == 6
    assert_one_line_error(refused, "answered 406", "not acceptable: Accept 'text/x-nothing' "
                                                   "asks for nothing this model answers with")

    pids = [i["pid"] for i in data["instances"]]
    deleted = run_cli("endpoints", "delete", "cli-linear")
    assert deleted.returncode == 0 and "deleted endpoint cli-linear" in deleted.stderr
    assert all(not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
               for pid in pids)
    gone = run_cli("endpoints", "describe", "cli-linear")
    assert gone.returncode == 3
    assert_one_line_error(gone, "no endpoint named 'cli-linear'")


def test_unknown_endpoint_and_bad_body_file(session, tmp_path):
    for args in (("endpoints", "invoke", "nope", "--body", "[1]"),
                 ("endpoints", "delete", "nope"), ("endpoints", "describe", "nope")):
        proc = run_cli(*args)
        assert proc.returncode == 3, proc.stderr
        assert_one_line_error(proc, "'nope'")
    empty = run_cli("endpoints", "list")
    assert empty.returncode == 0 and "no endpoints" in empty.stderr
    missing = run_cli("endpoints", "invoke", "nope", "--body", f"@{tmp_path / 'none.json'}")
    assert missing.returncode == 2
    assert_one_line_error(missing, "cannot read the body file")


def test_serve_runs_the_server_in_the_foreground(onnx_dir, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*CLI, "serve", str(onnx_dir), "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"shoal serve exited: {log.read_text()}")
            return httpx.get(f"{url}/ping", timeout=2).status_code == 200

        wait_until(up, 60, what="shoal serve answers /ping")
        answer = httpx.post(f"{url}/invocations", json=[[0, 0, 0, 0]], timeout=10)
        assert answer.status_code == 200 and np.allclose(answer.json(), B[None, :])
    finally:
        proc.send_signal(signal.SIGTERM)  # the server itself: serve exec'd it
        assert proc.wait(timeout=30) is not None
