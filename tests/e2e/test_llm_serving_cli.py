"""An LLM through the ``shoal`` command (issue #8): ``shoal serve DIR`` on a directory with
``serving.properties`` answers ``/ping`` and LMI ``/invocations`` in the foreground; ``shoal
endpoints invoke`` speaks to an LLM endpoint made by ``Model(model_data=DIR).deploy()``, and
``shoal endpoints delete`` removes it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

import shoal  # noqa: E402
from helpers import wait_until  # noqa: E402
from llm_models import Reference, make_tiny_llm  # noqa: E402
from shoal.endpoints import EndpointService  # noqa: E402
from shoal.model import Model  # noqa: E402

CLI = [sys.executable, "-m", "shoal.cli"]
PROMPT = "Every job batches"


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llm(tmp_path_factory.mktemp("llm") / "model")


@pytest.fixture(scope="module")
def want(model_dir: Path) -> str:
    return Reference(model_dir).text(PROMPT, 8)


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


def test_shoal_serve_serves_an_llm_directory_in_the_foreground(model_dir, want, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*CLI, "serve", str(model_dir), "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"shoal serve exited: {log.read_text()}")
            return httpx.get(f"{url}/ping", timeout=5).status_code == 200

        wait_until(up, 90, what="shoal serve answers /ping")
        assert httpx.get(f"{url}/ping").json() == {"status": "healthy"}
        answer = httpx.post(f"{url}/invocations", timeout=60, json={
            "inputs": PROMPT, "parameters": {"max_new_tokens": 8, "do_sample": False}})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"generated_text": want}
        streamed = httpx.post(f"{url}/invocations", timeout=60, json={
            "inputs": PROMPT, "parameters": {"max_new_tokens": 8}, "stream": True})
        lines = [json.loads(line) for line in streamed.text.splitlines() if line]
        assert "".join(line["token"]["text"] for line in lines) == want
    finally:
        proc.send_signal(signal.SIGTERM)  # the server itself: serve exec'd it
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert "shoal LLM server listening on" in log.read_text()


def test_shoal_endpoints_invoke_an_llm_endpoint_then_delete_it(session, model_dir, want):
    Model(model_data=str(model_dir), env={"OMP_NUM_THREADS": "1"},
          sagemaker_session=session).deploy(endpoint_name="cli-llm")
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "do_sample": False}}
    invoked = run_cli("endpoints", "invoke", "cli-llm", "--body", json.dumps(body))
    assert invoked.returncode == 0, invoked.stderr
    assert json.loads(invoked.stdout) == {"generated_text": want}

    bad = run_cli("endpoints", "invoke", "cli-llm", "--body",
                  json.dumps({"inputs": PROMPT, "parameters": {"max_new_tokens": 0}}))
    assert bad.returncode == 6, bad.stderr
    assert "'cli-llm' answered 422" in bad.stderr and "max_new_tokens" in bad.stderr

    deleted = run_cli("endpoints", "delete", "cli-llm")
    assert deleted.returncode == 0 and "deleted endpoint cli-llm" in deleted.stderr
    assert run_cli("endpoints", "describe", "cli-llm").returncode == 3
