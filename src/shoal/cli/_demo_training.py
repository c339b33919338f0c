"""``shoal demo``, script-mode training: the PyTorch MNIST example's CNN, inside an experiment run.

The data is scikit-learn's bundled digits (no download), upsampled to MNIST's 28×28 and written
as the files of a ``training`` and a ``testing`` channel; the script is an ordinary SageMaker
training script (``demo_assets/train_mnist.py``, shipped as package data) that saves the state
dict, exports ONNX and checks it with onnxruntime before the job may succeed.
"""

from __future__ import annotations

import importlib.resources
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.text import Text

from shoal._internal.archives import extract_tar
from shoal.cli._context import emit, out, state
from shoal.cli._render import elapsed_seconds, format_duration, status_text

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["prepare_digits", "run_training_demo"]

EXPERIMENT = "mnist-digits"
MIN_ACCURACY = 0.8
HYPERPARAMETERS = {"epochs": 2, "batch-size": 64, "lr": 0.002, "seed": 1}
METRICS: list[Mapping[str, str]] = [{"Name": "train:loss", "Regex": r"train_loss=([0-9.]+)"},
                                     {"Name": "test:accuracy",
                                      "Regex": r"test_accuracy=([0-9.]+)"}]


def _heading(number: int, title: str) -> None:
    out().print()
    out().print(Text(f"{number}. {title}", style="bold cyan"))


def _note(text: str, style: str = "dim") -> None:
    out().print(Text(f"   {text}", style=style))


def _bilinear(n_in: int, n_out: int) -> np.ndarray:
    """The matrix of 1-D bilinear resampling, as torch's interpolate(align_corners=False)."""
    src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(int), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    weight = src - lo
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), lo), 1.0 - weight)
    np.add.at(m, (np.arange(n_out), hi), weight)
    return m


def prepare_digits(root: Path, *, test_fraction: float = 0.2,
                   seed: int = 0) -> tuple[Path, Path, int, int]:
    """scikit-learn's 1,797 8×8 digits as 28×28 images in [0, 1], split and written as
    ``<root>/training/digits.npz`` and ``<root>/testing/digits.npz``.

    Returns the two channel directories and their sizes.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    m = _bilinear(8, 28)
    images = np.einsum("oi,nij,pj->nop", m, digits.images / 16.0, m).astype(np.float32)
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(round(len(labels) * test_fraction))
    dirs = []
    for name, idx in (("training", order[n_test:]), ("testing", order[:n_test])):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        np.savez(d / "digits.npz", images=images[idx], labels=labels[idx])
        dirs.append(d)
    return dirs[0], dirs[1], len(labels) - n_test, n_test


def run_training_demo(session: Session, number: int) -> None:
    _heading(number, "PyTorch(entry_point='train.py') in an experiment Run: the MNIST CNN, "
                     "2 epochs, exported to ONNX")
    with tempfile.TemporaryDirectory(prefix="shoal-demo-train-") as tmp:
        root = Path(tmp)
        train_dir, test_dir, n_train, n_test = prepare_digits(root / "data")
        _note(f"scikit-learn's digits upsampled to 28×28: {n_train} images in channel "
              f"'training', {n_test} in 'testing' ({root / 'data'})")
        source = root / "src"
        source.mkdir()
        script = importlib.resources.files("shoal.cli") / "demo_assets" / "train_mnist.py"
        (source / "train.py").write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
        estimator, run_name = _fit(source, train_dir, test_dir)
        _accuracy(estimator)
        _check_model(estimator.model_data, test_dir)
    _report(session, estimator, run_name)


def _fit(source: Path, train_dir: Path, test_dir: Path) -> tuple[Any, str]:
    from shoal.experiments.run import Run
    from shoal.pytorch import PyTorch

    run_name = f"cnn-{datetime.now(UTC):%y%m%d-%H%M%S-%f}"
    with Run(experiment_name=EXPERIMENT, run_name=run_name) as run:
        run.log_parameters(HYPERPARAMETERS)
        estimator = PyTorch(
            entry_point="train.py", source_dir=str(source),
            framework_version=version("torch").split("+")[0], instance_type="local",
            hyperparameters=HYPERPARAMETERS, metric_definitions=METRICS,
            # One thread: on a small shared machine OpenMP's spinning threads lose more time
            # than they gain (the instance type would give each core one).
            environment={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        _note(f"PyTorch(entry_point='train.py', framework_version="
              f"{estimator.framework_version!r}, hyperparameters={HYPERPARAMETERS}, "
              f"metric_definitions=[train:loss, test:accuracy]).fit({{'training': ..., "
              f"'testing': ...}}) inside Run(experiment_name={EXPERIMENT!r}, "
              f"run_name={run_name!r}); the job's output:")
        estimator.fit({"training": str(train_dir), "testing": str(test_dir)})
    return estimator, run_name


def _check_model(model_data: str, test_dir: Path) -> None:
    """model.tar.gz holds the state dict and model.onnx; the ONNX model classifies the test
    channel in onnxruntime here, in the client."""
    import fsspec
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="shoal-demo-model-") as tmp:
        model_dir = Path(tmp) / "model"
        with fsspec.open(model_data, "rb") as f:
            extract_tar(f, model_dir, label=f"model_data {model_data}")
        names = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*"))
        _note(f"model_data {model_data}", style="")
        _note(f"   holds {', '.join(names)}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        onnx_model = ort.InferenceSession(str(model_dir / "model.onnx"), options,
                                          providers=["CPUExecutionProvider"])
    with np.load(test_dir / "digits.npz") as data:
        images, labels = data["images"], data["labels"]
    x = ((images - 0.1307) / 0.3081)[:, None].astype(np.float32)  # the script's normalisation
    [log_probs] = onnx_model.run(None, {"input": x})
    accuracy = float((log_probs.argmax(axis=1) == labels).mean())
    _note(f"   model.onnx in onnxruntime, all {len(labels)} test images in one batch: "
          f"accuracy {accuracy:.4f}")


def _accuracy(estimator: Any) -> None:
    from shoal.errors import JobFailedError

    job = estimator.latest_training_job
    final = {m["MetricName"]: m["Value"] for m in job.describe()["FinalMetricDataList"]}
    accuracy = final.get("test:accuracy")
    if accuracy is None or not accuracy > MIN_ACCURACY:
        raise JobFailedError(f"training job {job.name}: test accuracy {accuracy} is not above "
                             f"{MIN_ACCURACY}; shoal {state.home_option()}jobs logs {job.name}",
                             job=job.name)
    _note(f"test accuracy {accuracy:.4f} (> {MIN_ACCURACY}): the job's last 'test:accuracy' "
          "in latest_training_job.describe()['FinalMetricDataList']", style="bold")


def _report(session: Session, estimator: Any, run_name: str) -> None:
    from shoal.cli._experiments import metrics_table

    job = estimator.latest_training_job
    record = session.metadata.get_run(EXPERIMENT, run_name)
    _note(f"run {EXPERIMENT}/{run_name} {record.status}: jobs {', '.join(record.jobs)}, "
          f"parameters {dict(sorted(record.parameters.items()))}; its metrics:", style="")
    emit(metrics_table(session.metadata.metric_summaries(record.metrics_owner)))
    job_record = job.record()
    line = Text("   job ") + Text(job.name, style="bold") + Text("  ")
    line += status_text(job_record.status)
    line += Text(f"  {format_duration(elapsed_seconds(job_record))}", style="dim")
    out().print(line)
    home = state.home_option()
    _note(f"find them again: shoal {home}jobs describe {job.name}; shoal {home}runs show "
          f"{run_name}; shoal {home}jobs metrics {job.name}")
