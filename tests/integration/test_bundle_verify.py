"""Every bundle target installed into a fresh virtualenv with only its own requirements and run
as its platform would (``verify_bundle``): Azure through ``azure.functions.HttpRequest`` against
the function registered on ``function_app.app``, Lambda through payload-2.0 events, the ASGI
app and the container's server entry under uvicorn over HTTP. Answers match the source model.

The environments are cached per requirements (uv) in a directory all xdist workers of the
session share, so each distinct requirements.txt is installed once per test session.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bundle_models import make_mnist_cnn, once, session_shared, tiny_classifier
from shoal.bundles import build_bundle, verify_bundle
from shoal.estimator import Estimator


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    return session_shared(tmp_path_factory, worker_id)


@pytest.fixture(scope="session")
def mnist(shared: Path) -> Path:
    return once(shared, "mnist-cnn", make_mnist_cnn)


@pytest.fixture(scope="session")
def envs(shared: Path) -> Path:
    return shared / "envs"


CHECKS = ["loads", "no shoal", "batch", "one sample, raw outputs by query", "malformed JSON",
          "wrong number of values", "npy batch"]


@pytest.mark.parametrize("target, quantize", [
    ("azure-functions", None), ("aws-lambda", False), ("container", False), ("asgi", None)])
def test_each_target_runs_in_a_fresh_env_and_answers_like_the_source(mnist, envs, tmp_path,
                                                                      target, quantize):
    record = build_bundle(mnist, target=target, output=tmp_path / f"{target}.zip",
                          samples=mnist / "samples.npy", quantize=quantize,
                          auth_level="anonymous" if target == "azure-functions" else None)
    report = verify_bundle(record.path, env_root=envs, timeout=120)
    assert report.ok, "\n".join(f"{c.name}: {c.detail}" for c in report.checks)
    names = [c.name for c in report.checks]
    assert set(CHECKS) <= set(names)
    assert ("describe" if target in ("azure-functions", "aws-lambda") else "ping") in names
    assert report.parity.samples == 32 and report.parity.agreement == 1.0
    if quantize is False:
        assert report.weights == "float32" and report.parity.max_abs_diff < 1e-4
    else:
        assert report.weights == "int8" and report.parity.max_abs_diff < 0.5
    # The held-out synthetic digits: the bundle still reads them as the source model did.
    labels = np.load(mnist / "labels.npy")[:32]
    batch = next(c for c in report.checks if c.name == "batch")
    assert "agree" in batch.detail and labels.size == 32
    if target == "azure-functions":
        binding = next(c for c in report.checks if c.name == "azure function binding")
        assert "route 'classify', auth level anonymous" in binding.detail
        assert "['GET', 'POST']" in binding.detail
    assert report.installed_bytes > record.size_bytes and report.warnings == ()


def test_verify_reports_a_bundle_that_cannot_load(tmp_path, envs):
    record = build_bundle(tiny_classifier(tmp_path / "m" / "model.onnx").parent, target="asgi",
                          output=tmp_path / "asgi")
    (record.path / "model" / "model.onnx").write_bytes(b"this is no longer a model")
    report = verify_bundle(record.path, env_root=envs, timeout=60)
    assert not report.ok
    [loads] = [c for c in report.checks if c.name == "loads"]
    assert not loads.ok and "uvicorn app:app exited" in loads.detail
    assert "model.onnx" in loads.detail or "INVALID_PROTOBUF" in loads.detail


def test_a_scikit_learn_bundle_answers_with_sklearns_labels(tmp_path, envs):
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=500).fit(x, np.array(["setosa", "versicolor",
                                                              "virginica"])[y])
    (tmp_path / "iris").mkdir()
    joblib.dump(model, tmp_path / "iris" / "model.joblib")
    np.save(tmp_path / "x.npy", x[::3].astype(np.float32))
    record = build_bundle(tmp_path / "iris", target="aws-lambda", output=tmp_path / "b.zip",
                          samples=tmp_path / "x.npy")
    report = verify_bundle(record.path, env_root=envs, timeout=120)
    assert report.ok, "\n".join(f"{c.name}: {c.detail}" for c in report.checks)
    assert report.parity.agreement >= 0.96  # sklearn (float64) against its ONNX (float32)


TRAIN = """
import os, shutil
shutil.copy("model.onnx", os.path.join(os.environ["SM_MODEL_DIR"], "model.onnx"))
open(os.path.join(os.environ["SM_MODEL_DIR"], "notes.txt"), "w").write("trained")
"""


def test_a_training_jobs_name_is_a_model(session, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(TRAIN))
    tiny_classifier(src / "model.onnx")
    est = Estimator(entry_point="train.py", source_dir=str(src), base_job_name="tiny")
    est.fit(logs=False)
    name = est.latest_training_job.name
    record = build_bundle(name, target="asgi", output=tmp_path / "from-job")
    manifest = json.loads((record.path / "model" / "bundle.json").read_text())
    assert manifest["source"] == {"model": name, "type": "onnx", "file": "model.onnx"}
    assert record.name == name
    assert (record.path / "model" / "model.onnx").read_bytes() == (src / "model.onnx").read_bytes()
    shutil.rmtree(record.path)
    # The training job's model_data URI names the same model.
    record = build_bundle(est.model_data, target="aws-lambda", output=tmp_path / "from-uri")
    assert record.source == est.model_data and record.name == name


def test_importing_bundles_loads_no_model_library():
    import subprocess
    import sys

    code = ("import sys, shoal.bundles, shoal.model; print(sorted(m for m in ('numpy', 'onnx', "
            "'onnxruntime', 'skl2onnx', 'torch', 'httpx') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
