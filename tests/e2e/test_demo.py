"""``shoal demo`` runs the seed examples as real jobs and says how to find each one again."""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import shoal


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_demo_runs_the_seed_examples_as_jobs(clean_env: Path, tmp_path: Path):
    home = tmp_path / "demo-home"
    env = {**os.environ, "SHOAL_HOME": str(home), "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run([sys.executable, "-m", "shoal.cli", "demo"], env=env,
                              capture_output=True, text=True, timeout=340,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout
        assert "0.6666666666666666" in out
        assert "[0, 1, 4, 9]" in out
        assert "ZeroDivisionError" in out and "user_error" in out
        for prefix in ("divide-", "matrix-multiply-", "square-", "numpy-version-"):
            assert f"shoal jobs describe {prefix}" in out, prefix
        # The config-file job took its settings from the file.
        assert "InstanceType = 'ml.m5.large'" in out and "someTagKey" in out
        assert "EnvVarKey" in out and "EnvVarValue" not in out  # a secret-looking name
        assert "get_future(" in out

        # The jobs are in the home's history; --home finds them while SHOAL_HOME points away.
        listed = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(home), "jobs",
                                 "list", "--json"], capture_output=True, text=True, timeout=60,
                                check=True)
        records = json.loads(listed.stdout)
        by_status = [r["status"] for r in records]
        assert by_status.count("failed") == 1  # divide(1, 0)
        assert all(s in ("completed", "failed") for s in by_status)
        for record in records:
            if not record["name"].startswith(("which-six-", "featurize-", "ready-", "add-")):
                assert record["name"] in out
        # Runtime environments: an isolated env, the shipped workdir, pre-execution, warm pool.
        assert "six 1.16.0 from" in out and "cache hit" in out
        assert "result [2, 4, 6]" in out and "scratch.tmp" not in out
        assert "preparing the job" in out
        assert "next 20 calls p50" in out
        _check_training_section(out, tmp_path)
        _check_endpoint_section(out)
        _check_bundle_section(out)
        assert "FineTuner(method='lora')" in out and "loss by step" in out  # LLM section
        _check_sagemaker_section(out, home)
        _check_security_section(out, home, tmp_path)
        _check_cli_section(out, home)
        _check_server_section(out)
    finally:
        session = shoal.Session(home=str(home))
        session.backend.shutdown_launcher()
        session.close()


def _check_training_section(out: str, tmp_path: Path) -> None:
    """Script mode: the MNIST CNN trained in a run, its accuracy, model_data and metrics."""
    section = out[out.index("11. PyTorch(entry_point='train.py')"):]
    accuracy = float(re.search(r"test accuracy (\d\.\d+) \(> 0\.8\)", section).group(1))
    assert accuracy > 0.8
    for epoch in (1, 2):  # the script's own lines, streamed from the job
        assert re.search(rf"epoch {epoch}: train_loss=[0-9.]+ .*test_accuracy=[0-9.]+", section)
    assert "onnx parity batch=1:" in section and "onnx parity batch=64:" in section
    onnx_accuracy = float(re.search(r"model\.onnx in onnxruntime, all \d+ test images in one "
                                    r"batch: accuracy (\d\.\d+)", section).group(1))
    assert onnx_accuracy > 0.8
    # The run holds the job and both series of its metric_definitions, two epochs each.
    run = re.search(r"run mnist-digits/(cnn-\S+) Completed: jobs (train-\S+),", section)
    assert run is not None, section
    for metric in ("test:accuracy", "train:loss"):
        assert re.search(rf"^{re.escape(metric)}\s+2\s", section, re.M), metric
    assert f"shoal runs show {run.group(1)}" in section

    # model_data: a tar.gz with the state dict and an ONNX model with a dynamic batch axis.
    uri = re.search(r"model_data (file://\S+/output/model\.tar\.gz)", section).group(1)
    assert run.group(2) in uri
    path = Path(uri.removeprefix("file://"))
    assert path.is_file()
    with tarfile.open(path, "r:gz") as tar:
        assert sorted(tar.getnames()) == ["model.onnx", "model.pth"]
        tar.extractall(tmp_path / "model", filter="data")
    import onnx
    import torch

    state = torch.load(tmp_path / "model" / "model.pth", weights_only=True)
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes == {"conv1.weight": (32, 1, 3, 3), "conv1.bias": (32,),
                      "conv2.weight": (64, 32, 3, 3), "conv2.bias": (64,),
                      "fc1.weight": (128, 9216), "fc1.bias": (128,),
                      "fc2.weight": (10, 128), "fc2.bias": (10,)}
    model = onnx.load(str(tmp_path / "model" / "model.onnx"))
    onnx.checker.check_model(model)
    [batch_dim, *_] = model.graph.input[0].type.tensor_type.shape.dim
    assert batch_dim.dim_param and not batch_dim.dim_value  # a named, dynamic batch axis


def _check_endpoint_section(out: str) -> None:
    """Real-time inference: the trained CNN's ONNX model on a two-instance endpoint."""
    section = out[out.index("12. Model(model_data=...).deploy(initial_instance_count=2)"):]
    training_job = re.search(r"run mnist-digits/cnn-\S+ Completed: jobs (train-\S+),", out)
    assert training_job is not None
    assert re.search(rf"model_data file://\S+/{training_job.group(1)}/output/model\.tar\.gz  "
                     rf"\(training job {training_job.group(1)}\)", section), section
    endpoint = re.search(r"endpoint (digits-\d+)  InService .*: http://127\.0\.0\.1:\d+ "
                         r"\(pid (\d+)\), http://127\.0\.0\.1:\d+ \(pid (\d+)\)", section)
    assert endpoint is not None, section
    assert re.search(r"predictor\.predict\(\d+×1×28×28 float32 array as application/x-npy\)",
                     section)
    predictions = re.search(r"predictions (\[[\d, ]+\])", section).group(1)
    labels = re.search(r"labels +(\[[\d, ]+\])", section).group(1)
    assert len(json.loads(predictions)) == len(json.loads(labels)) == 20
    accuracy = float(re.search(r"endpoint accuracy (\d\.\d+) on \d+ test digits",
                               section).group(1))
    assert accuracy > 0.8
    assert f"endpoint {endpoint.group(1)} deleted" in section
    for pid in endpoint.group(2, 3):  # the servers are gone, and so is the record
        assert not Path(f"/proc/{pid}").exists() or " Z " in Path(f"/proc/{pid}/stat").read_text()


def _check_bundle_section(out: str) -> None:
    """Portable bundles of the trained CNN: Azure Functions and ASGI, each at most 2 MB."""
    section = out[out.index("13. Model(model_data=...).bundle(target=...)"):]
    assert "(training job train-" in section
    sizes = re.findall(r"(azure-functions|asgi) +(\d+\.\d+) MB zipped", section)
    assert [t for t, _ in sizes] == ["azure-functions", "asgi"], section
    assert all(float(mb) <= 2.0 for _, mb in sizes), sizes
    assert re.search(r"int8 weights: \d+\.\d% of \d+ test digits", section), section
    verified = re.search(r"bundle verify \S+digits-asgi: (\d+)/(\d+) checks passed", section)
    assert (verified and verified.group(1) == verified.group(2)) or "verify skipped" in section


def _check_sagemaker_section(out: str, home: Path) -> None:
    """Notebook-style code through ``import shoal as sagemaker``: a real fit and endpoints."""
    section = out[out.index("16. SageMaker code as it is"):out.index("17. security")]
    assert "reported once: get_execution_role()" in section and "no effect" in section
    upload = re.search(r"key_prefix=\.\.\.\) -> (file://\S+/train\.csv)", section).group(1)
    assert Path(upload.removeprefix("file://")).is_file() and str(home) in upload
    assert re.search(r"image_uris\.retrieve\('sklearn', 'us-east-1', '[\d.-]+'\) -> "
                     r"shoal\.local/sklearn:[\d.-]+", section) or \
        "image_uris.retrieve skipped: the installed scikit-learn" in section
    job = re.search(r"\.fit\(\{'train': \.\.\.\}\): job (iris-sklearn-\S+) Completed, no "
                    r"environment built", section)
    assert job is not None, section
    assert not (home / "envs" / "framework-releases").exists()  # nothing was resolved or built
    predicted = re.search(r"predict\(iris\.data\[\[0, 50, 100\]\]\) -> (\[.*?\]) "
                          r"\(labels (\[.*?\])\)", section)
    assert predicted and json.loads(predicted.group(1)) == json.loads(predicted.group(2)), section
    assert f"endpoint {job.group(1)} deleted" in section
    generic = re.search(r"Model\(image_uri, model_data, role\) by position .*JSON "
                        r"predict\(iris\.data\[\[1, 51, 101\]\]\) -> (\[.*?\])", section)
    assert generic and json.loads(generic.group(1)) == [0.0, 1.0, 2.0], section
    endpoints = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(home),
                                "endpoints", "list", "--json"], capture_output=True, text=True,
                               timeout=60, check=True)
    assert json.loads(endpoints.stdout) == []  # both endpoints were deleted


def _check_security_section(out: str, home: Path, tmp_path: Path) -> None:
    """No job key stored, the token masked in describe and in the log, a 0700 home."""
    section = out[out.index("17. security"):out.index("18. the CLI")]
    secret_file = tmp_path / "xdg-config" / "shoal" / "user-secret"  # clean_env's XDG dir
    assert f"user secret {secret_file}: mode 0600 in a 0700 directory, 32 bytes" in section
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    assert re.search(r"has key_salt = [0-9a-f]{16,} and no key; neither the job's derived key "
                     r"nor the token's value appears in it", section), section
    assert "demo-tok-7Qx2Lm9Vb4Rz" not in out and "Lm9Vb4Rz" not in out
    assert re.search(r"shoal jobs describe: DEMO_API_TOKEN\s+\*\*\*\*", section), section
    assert "shoal jobs logs: DEMO_API_TOKEN=**** (end of the value)" in section
    assert f"home {home}: mode 0700" in section and oct(home.stat().st_mode & 0o777) == "0o700"


def _check_cli_section(out: str, home: Path) -> None:
    """A command as a job, the background processes, and a gc dry run that deletes nothing."""
    section = out[out.index("18. the CLI for what runs"):]
    assert "hello from a command job" in section
    assert re.search(r"job hello-\S+ completed", section), section
    assert re.search(r"PID +KIND +NAME", section) and "launcher" in section
    summary = re.search(r"would remove (\d+) job\(s\).*\(dry run: nothing was deleted\)",
                        section)
    assert summary and int(summary.group(1)) > 20, section
    before, after = re.search(r"jobs recorded before (\d+), after (\d+)", section).groups()
    assert before == after == summary.group(1)
    assert (home / "shoal.db").is_file()


def test_demo_training_script_fails_the_job_when_onnx_parity_fails(tmp_path: Path):
    """The shipped train.py writes output/failure and exits non-zero when a check fails."""
    script = importlib.resources.files("shoal.cli") / "demo_assets" / "train_mnist.py"
    rng = np.random.default_rng(0)
    for channel in ("training", "testing"):
        (tmp_path / channel).mkdir()
        np.savez(tmp_path / channel / "digits.npz",
                 images=rng.random((8, 28, 28), dtype=np.float32),
                 labels=rng.integers(0, 10, 8))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SM_MODEL_DIR": str(tmp_path / "model"),
           "SM_OUTPUT_DIR": str(tmp_path / "output"),
           "SM_CHANNEL_TRAINING": str(tmp_path / "training"),
           "SM_CHANNEL_TESTING": str(tmp_path / "testing")}
    # No epochs, and a tolerance nothing can meet: the parity check must fail the script.
    proc = subprocess.run([sys.executable, str(script), "--epochs", "0", "--onnx-tolerance",
                           "0"], env=env, capture_output=True, text=True, timeout=100,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure.startswith("ValueError: onnxruntime differs from torch by "), failure
    assert "onnx parity batch=1:" in proc.stdout and "onnx parity batch=8:" in proc.stdout


def _check_server_section(out: str) -> None:
    section = out.split("19. the team server", 1)[1]
    job = re.search(r"job (team-hello-\S+) completed", section)
    assert job is not None, section
    assert re.search(r"hello from \S+ in \S+/server/work/\S+$", section, re.M), section
    assert "jobs describe: status completed" in section
    assert "jobs describe: owner alice" in section  # the token's user
    assert "on the server (True)" in section and "holds nothing (True)" in section
    assert "a wrong token: error: the API token is not known to this server" in section
    assert re.search(r"its web console: http://127\.0\.0\.1:\d+/console/", section), section
    assert "/console/login" in section  # where it sent a visitor who had not signed in
