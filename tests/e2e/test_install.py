"""shoal installed as a user installs it: the wheel with one extra in a fresh virtualenv, run
from a directory outside the checkout. A dependency a feature imports but its extra does not
bring fails here; so does a feature whose missing extra is not named.

Each test's venv holds only the wheel and what its extra pulls (tests/installs.py). The test
process (the dev venv) only makes inputs (an ONNX file, a tiny LLM) and talks HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from helpers import wait_until
from installs import run_python, user_env, venv

# Each test may build its venv first (seconds from a warm uv cache, minutes from a cold one).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_venv_runs_the_installed_wheel_not_the_checkout(tmp_path: Path):
    env = venv("")
    out = _ok(run_python(env, "import shoal, sys; print(shoal.__file__); print(sys.path)",
                         tmp_path))
    assert str(env) in out.splitlines()[0] and "/src/shoal" not in out.splitlines()[0]


# --- the base install: every feature whose extra is missing names it --------------------

MISSING_EXTRAS = r'''
import json, sys
from pathlib import Path
import shoal
from shoal.errors import MissingExtraError

def attempt(name, call):
    try:
        call()
    except MissingExtraError as e:
        return {"case": name, "extra": e.details["extra"], "message": str(e)}
    except BaseException as e:
        return {"case": name, "error": f"{type(e).__name__}: {e}"}
    return {"case": name, "error": "no error"}

def export():
    from shoal.export.onnx import export
    export(object(), None, "model.onnx")

def export_sklearn():
    from shoal.export.onnx import export_sklearn
    export_sklearn(object(), 4, "model.onnx")

def deploy():
    Path("model").mkdir(exist_ok=True)
    Path("model/model.onnx").write_bytes(b"onnx")
    shoal.Model(model_data="model").deploy()

def analytics():
    from shoal.analytics import ExperimentAnalytics
    ExperimentAnalytics(experiment_name="none").dataframe()

def graph():
    from shoal.experiments.run import Run
    with Run(experiment_name="e", run_name=None) as run:
        run.log_confusion_matrix([0, 1], [0, 1])

def s3():
    shoal.Session(artifact_url="s3://bucket/prefix").artifacts

def postgres():
    shoal.Session(metadata_url="postgresql://u@127.0.0.1:1/db").metadata

def ray():
    shoal.remote(lambda: 1, sagemaker_session=shoal.Session(backend="ray"))()

def bundle():
    from shoal.bundles import build_bundle
    build_bundle("model", target="asgi", output="out")

def finetune():
    from shoal.llm import finetune
    finetune("base", "data.jsonl", output_dir="out", method="lora")

def numpy_serializer():
    from shoal.serializers import NumpySerializer
    NumpySerializer().serialize([1, 2])

cases = [("export", export), ("export_sklearn", export_sklearn), ("deploy", deploy),
         ("analytics", analytics), ("graph", graph), ("s3", s3), ("postgres", postgres),
         ("ray", ray), ("bundle", bundle), ("finetune", finetune),
         ("numpy_serializer", numpy_serializer)]
print(json.dumps([attempt(n, c) for n, c in cases]))
'''

EXPECTED_EXTRA = {"export": "torch", "export_sklearn": "sklearn", "deploy": "serve",
                  "analytics": "experiments", "graph": "experiments", "s3": "s3",
                  "postgres": "postgres", "ray": "ray", "bundle": "bundle", "finetune": "llm",
                  "numpy_serializer": "serve"}


def test_base_install_names_the_extra_each_feature_needs(tmp_path: Path):
    results = json.loads(_ok(run_python(venv(""), MISSING_EXTRAS, tmp_path)).splitlines()[-1])
    got = {r["case"]: r for r in results}
    for case, extra in EXPECTED_EXTRA.items():
        assert "error" not in got[case], (case, got[case])
        assert got[case]["extra"] == extra, (case, got[case])
        assert f'pip install "shoal[{extra}]"' in got[case]["message"], got[case]


def test_shoal_serve_on_a_base_install_names_the_serve_extra_before_listening(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.onnx").write_bytes(b"not read: the extra is checked first")
    env = venv("")
    proc = subprocess.run([str(env / "bin" / "shoal"), "serve", str(model), "--port", "0",
                           "--host", "127.0.0.1"], cwd=tmp_path, env=user_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert 'pip install "shoal[serve]"' in output and "uvicorn" in output, output
    assert "listening" not in output and "Traceback" not in output, output


def test_shoal_serve_on_a_serve_install_refuses_a_sklearn_model_naming_its_extra(
        tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.joblib").write_bytes(b"not read: the extra is checked first")
    proc = subprocess.run([str(venv("serve") / "bin" / "python"), "-m", "shoal.serving",
                           "--model", str(model), "--port", "0", "--host", "127.0.0.1"],
                          cwd=tmp_path, env=user_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and 'pip install "shoal[sklearn]"' in output, output
    assert "listening" not in output and "Traceback" not in output, output


# --- one smoke test per extra -----------------------------------------------------------

class _Server:
    """A server process from a venv, stopped (SIGTERM) and reaped at the end."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.log = cwd / "server.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=user_env(cwd), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def ready(self, url: str, timeout: float) -> None:
        def up() -> bool:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")
            return httpx.get(f"{url}/ping", timeout=5).status_code == 200

        wait_until(up, timeout, interval=0.2, what=f"{url}/ping answering 200")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def test_serve_extra_serves_an_onnx_model(tmp_path: Path):
    from bundle_models import tiny_classifier

    tiny_classifier(tmp_path / "model" / "model.onnx", features=4, classes=3)
    port = _free_port()
    server = _Server([str(venv("serve") / "bin" / "shoal"), "serve", str(tmp_path / "model"),
                      "--port", str(port), "--host", "127.0.0.1"], tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        server.ready(url, 120)
        answer = httpx.post(f"{url}/invocations", json=[[1, 2, 3, 4], [0, 0, 0, 0]],
                            timeout=30)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()) == 2 and len(answer.json()[0]) == 3
        assert "shoal_" in httpx.get(f"{url}/metrics", timeout=10).text  # prometheus-client
    finally:
        server.stop()


SKLEARN = r'''
import numpy as np
from sklearn.linear_model import LogisticRegression
from shoal.export.onnx import export_sklearn, verify
from shoal.bundles import build_bundle

x = np.random.default_rng(0).normal(size=(60, 4)).astype("float32")
clf = LogisticRegression().fit(x, (x[:, 0] > 0).astype(int))
export_sklearn(clf, 4, "model/model.onnx")
print("verify", verify("model/model.onnx", lambda a: (clf.predict(a), clf.predict_proba(a)),
                      x[:8]).ok)
record = build_bundle("model", target="asgi", output="bundle")
print("bundle", sorted(record.files)[:3])
'''


def test_sklearn_extra_converts_verifies_and_bundles(tmp_path: Path):
    out = _ok(run_python(venv("sklearn"), SKLEARN, tmp_path))
    assert "verify True" in out and "bundle" in out, out
    assert (tmp_path / "bundle" / "app.py").is_file()


TORCH = r'''
import torch
from shoal.export.onnx import export, verify

net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
export(net, torch.randn(1, 1, 4, 4), "model/model.onnx")
print("verify", verify("model/model.onnx", net, torch.randn(5, 1, 4, 4)).ok)
'''


def test_torch_extra_exports_and_verifies_onnx(tmp_path: Path):
    out = _ok(run_python(venv("torch"), TORCH, tmp_path))
    assert "verify True" in out, out


EXPERIMENTS = r'''
from shoal.analytics import ExperimentAnalytics
from shoal.experiments.run import Run

for lr in (0.1, 0.01):
    with Run(experiment_name="smoke", run_name=None) as run:
        run.log_parameter("lr", lr)
        run.log_metric("loss", lr * 2)
        run.log_confusion_matrix([0, 1, 1], [0, 1, 0])
frame = ExperimentAnalytics(experiment_name="smoke").dataframe()
print("rows", len(frame), "loss" in " ".join(frame.columns))
'''


def test_experiments_extra_logs_graphs_and_builds_a_dataframe(tmp_path: Path):
    out = _ok(run_python(venv("experiments"), EXPERIMENTS, tmp_path))
    assert "rows 2 True" in out, out


JOB = r'''
import shoal
@shoal.remote
def add(a, b):
    return a + b
print("result", add(2, 3))
session = shoal.Session()
print("stores", session.settings.resolved_metadata_url().split(":")[0],
      session.settings.resolved_artifact_url().split(":")[0])
session.backend.shutdown_launcher()
'''


def test_s3_extra_runs_a_job_with_its_artifacts_on_s3(tmp_path: Path, s3_bucket_url, moto_server):
    url, _ = s3_bucket_url
    env = user_env(tmp_path, SHOAL_ARTIFACT_URL=url, AWS_ENDPOINT_URL=moto_server)
    out = _ok(run_python(venv("s3"), JOB, tmp_path, env=env))
    assert "result 5" in out and "stores sqlite s3" in out, out


def test_postgres_extra_runs_a_job_recorded_in_postgresql(tmp_path: Path, postgres_url: str):
    env = user_env(tmp_path, SHOAL_METADATA_URL=postgres_url)
    env_dir = venv("postgres")
    # the migrations ship in the wheel
    _ok(subprocess.run([str(env_dir / "bin" / "shoal"), "db", "upgrade", postgres_url],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120))
    out = _ok(run_python(env_dir, JOB, tmp_path, env=env))
    assert "result 5" in out and "stores postgresql" in out, out


RAY = r'''
import ray, ray.serve  # the backend's and the endpoints' imports
from shoal.backends.ray import RayBackend
from shoal._internal.extras import missing
print("missing", missing("ray", "ray.serve", "grpc"))
'''


def test_ray_extra_brings_what_the_ray_backend_imports(tmp_path: Path):
    # Importing only: starting a cluster is what the Ray tests (-m ray) do.
    out = _ok(run_python(venv("ray"), RAY, tmp_path))
    assert "missing []" in out, out


def test_llm_extra_serves_an_llm_with_shoal_serve(tmp_path: Path):
    from llm_models import make_tiny_llm

    make_tiny_llm(tmp_path / "llm")
    port = _free_port()
    server = _Server([str(venv("llm") / "bin" / "shoal"), "serve", str(tmp_path / "llm"),
                      "--port", str(port), "--host", "127.0.0.1"], tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        server.ready(url, 240)
        answer = httpx.post(f"{url}/v1/completions", json={
            "prompt": "hello", "max_tokens": 3, "temperature": 0}, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] is not None
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
    finally:
        server.stop()
