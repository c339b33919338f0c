"""``shoal demo``, real-time inference: the trained CNN's ONNX model behind an endpoint.

The model is the one the training section just produced (its ``model.tar.gz`` holds
``model.onnx``); without it, a scikit-learn classifier of the 8×8 digits is exported to ONNX
here instead. Two supervised server instances answer a batch of test digits sent as
``application/x-npy``; the demo prints predictions and accuracy, then deletes the endpoint.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.text import Text

from shoal.cli._context import out, state

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["run_endpoint_demo"]


def _heading(number: int, title: str) -> None:
    out().print()
    out().print(Text(f"{number}. {title}", style="bold cyan"))


def _note(text: str, style: str = "dim") -> None:
    out().print(Text(f"   {text}", style=style))


@dataclass(frozen=True)
class _DemoModel:
    model_data: str
    source: str
    images: np.ndarray
    labels: np.ndarray


def _trained_cnn(session: Session, since: datetime, tmp: Path) -> _DemoModel | None:
    """The training section's model and its test channel, when that section ran."""
    from shoal.core.jobs import JobStatus
    from shoal.core.ports import JobQuery

    try:
        from shoal.cli._demo_training import prepare_digits
    except ImportError:
        return None
    for record in session.metadata.list_jobs(JobQuery(
            statuses=(JobStatus.COMPLETED,), created_after=since, limit=50)):
        cfg = record.spec.training
        if cfg is None:
            continue
        model_data = cfg.model_data(record.name, str(session.artifacts.root))
        if "model.onnx" not in _members(model_data):
            continue
        _, test_dir, _, _ = prepare_digits(tmp / "data")  # the split the job was tested on
        with np.load(test_dir / "digits.npz") as data:
            images, labels = data["images"], data["labels"]
        x = ((images - 0.1307) / 0.3081)[:, None].astype(np.float32)  # the script's transform
        return _DemoModel(model_data, f"training job {record.name}", x, labels)
    return None


def _members(uri: str) -> list[str]:
    import fsspec

    try:
        with fsspec.open(uri, "rb") as f, tarfile.open(fileobj=f, mode="r:gz") as tar:
            return tar.getnames()
    except (OSError, tarfile.TarError):
        return []


def _exported_classifier(tmp: Path) -> _DemoModel:
    """No trained CNN: a logistic regression of the 8×8 digits, exported to ONNX here."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    from shoal.export.onnx import export_sklearn

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[:360], order[360:]
    clf = LogisticRegression(max_iter=2000).fit(x[train] / 16.0, y[train])
    model_dir = tmp / "digits-model"
    model_dir.mkdir()
    export_sklearn(clf, 64, model_dir / "model.onnx")
    return _DemoModel(str(model_dir), "a LogisticRegression exported with "
                      "shoal.export.onnx.export_sklearn", (x[test] / 16.0).astype(np.float32),
                      y[test])


def _labels(answer: Any) -> np.ndarray:
    """Class labels from the server's answer: scores (argmax), labels, or a dict of outputs."""
    if isinstance(answer, dict):
        answer = answer.get("label", answer.get("output_label", next(iter(answer.values()))))
    array = np.asarray(answer)
    return array.argmax(axis=1) if array.ndim == 2 else array.astype(int).reshape(-1)


def run_endpoint_demo(session: Session, number: int, since: datetime) -> None:
    from shoal.deserializers import JSONDeserializer
    from shoal.model import Model
    from shoal.serializers import NumpySerializer

    _heading(number, "Model(model_data=...).deploy(initial_instance_count=2): real-time "
                     "inference on an endpoint")
    with tempfile.TemporaryDirectory(prefix="shoal-demo-endpoint-") as tmp:
        demo = _trained_cnn(session, since, Path(tmp)) or _exported_classifier(Path(tmp))
        _note(f"model_data {demo.model_data}  ({demo.source})")
        name = f"digits-{datetime.now():%H%M%S}"
        started = time.monotonic()
        predictor = Model(model_data=demo.model_data, sagemaker_session=session).deploy(
            initial_instance_count=2, endpoint_name=name, serializer=NumpySerializer(),
            deserializer=JSONDeserializer())
        record = predictor.describe()
        out().print(Text("   endpoint ") + Text(name, style="bold") + Text("  ")
                    + Text(str(record.status), style="green")
                    + Text(f"  in {time.monotonic() - started:.1f}s: "
                           f"{', '.join(f'{i.url} (pid {i.pid})' for i in record.instances)}",
                           style="dim"))
        try:
            started = time.monotonic()
            predicted = _labels(predictor.predict(demo.images))
            took = time.monotonic() - started
            accuracy = float((predicted == demo.labels).mean())
            shape = "×".join(map(str, demo.images.shape))
            _note(f"predictor.predict({shape} float32 array as application/x-npy) in "
                  f"{took * 1000:.0f} ms", style="")
            _note(f"   predictions {predicted[:20].tolist()} ...")
            _note(f"   labels      {demo.labels[:20].tolist()} ...")
            _note(f"endpoint accuracy {accuracy:.4f} on {len(demo.labels)} test digits",
                  style="bold")
            _note(f"find it: shoal {state.home_option()}endpoints describe {name}; call it: "
                  f"shoal {state.home_option()}endpoints invoke {name} --body @FILE")
        finally:
            predictor.delete_endpoint()
        pids = ", ".join(str(i.pid) for i in record.instances)
        _note(f"predictor.delete_endpoint(): endpoint {name} deleted, server processes "
              f"{pids} stopped", style="")
