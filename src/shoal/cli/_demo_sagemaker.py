"""``shoal demo``, SageMaker code as it is: a notebook in the SDK v2's style run through
``import shoal as sagemaker``: session, role, bucket, ``upload_data``, ``image_uris``, an
``SKLearn`` script-mode job on iris, its endpoint behind a ``CSVSerializer``, and a generic
``Model(image_uri, model_data, role)`` given by position.

``SKLearn`` gets the installed scikit-learn as its ``framework_version``, so the job and its
endpoint run in the client's environment: nothing is built.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from rich.text import Text

from shoal.cli._context import out, state

__all__ = ["run_sagemaker_demo"]

_TRAIN = '''\
import argparse
import os

import joblib
import numpy as np
from sklearn.tree import DecisionTreeClassifier


def model_fn(model_dir):
    return joblib.load(os.path.join(model_dir, "model.joblib"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-depth", type=int, default=None)
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"))
    args, _ = parser.parse_known_args()
    data = np.loadtxt(os.path.join(args.train, "train.csv"), delimiter=",")
    clf = DecisionTreeClassifier(max_depth=args.max_depth, random_state=0)
    clf.fit(data[:, 1:], data[:, 0])
    print(f"train accuracy: {clf.score(data[:, 1:], data[:, 0]):.3f}")
    joblib.dump(clf, os.path.join(args.model_dir, "model.joblib"))
'''


def _note(text: str, style: str = "dim") -> None:
    out().print(Text(f"   {text}", style=style))


@contextlib.contextmanager
def _reports() -> Iterator[list[str]]:
    """The "has no effect" reports of the ``shoal.session`` logger made inside the block."""
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect(logging.WARNING)
    log = logging.getLogger("shoal.session")
    log.addHandler(handler)
    try:
        yield seen
    finally:
        log.removeHandler(handler)


def container_tag(version: str) -> str | None:
    """SageMaker's scikit-learn container tag for an installed release, if it has one."""
    from shoal.training.containers import container_for

    major_minor = ".".join(version.split("+")[0].split(".")[:2])
    container = container_for("sklearn", major_minor)
    return container.version if container is not None else None


def run_sagemaker_demo(number: int) -> None:
    out().print()
    out().print(Text(f"{number}. SageMaker code as it is: import shoal as sagemaker",
                     style="bold cyan"))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shoal-demo-sm-") as tmp, contextlib.chdir(tmp), \
            _reports() as reported:
        Path("train.py").write_text(_TRAIN, encoding="utf-8")
        _notebook(Path(tmp), reported)
    _note(f"{time.monotonic() - started:.1f}s")


def _notebook(tmp: Path, reported: list[str]) -> None:
    import sklearn
    from sklearn.datasets import load_iris

    import shoal as sagemaker
    from shoal.deserializers import JSONDeserializer
    from shoal.model import Model
    from shoal.serializers import CSVSerializer, JSONSerializer
    from shoal.sklearn import SKLearn

    sess = sagemaker.Session(**state.session_kwargs())  # the notebook's sagemaker.Session()
    try:
        role = sagemaker.get_execution_role()
        bucket = sess.default_bucket()
        _note(f"sess = sagemaker.Session(); role = sagemaker.get_execution_role() -> {role}")
        for message in reported:
            _note(f"reported once: {message}", style="yellow")
        shown = len(reported)
        iris = load_iris()
        Path("data").mkdir()
        np.savetxt("data/train.csv", np.column_stack([iris.target, iris.data]), delimiter=",")
        train_input = sess.upload_data("data/train.csv", bucket=bucket,
                                       key_prefix="sagemaker/DEMO-sklearn-iris/train")
        _note(f"bucket = sess.default_bucket() -> {bucket}")
        _note(f"sess.upload_data('data/train.csv', bucket=bucket, key_prefix=...) -> "
              f"{train_input}")
        installed = sklearn.__version__
        tag = container_tag(installed)
        image_uri = sagemaker.image_uris.retrieve("sklearn", "us-east-1", tag) if tag else None
        if image_uri:
            _note(f"image_uris.retrieve('sklearn', 'us-east-1', {tag!r}) -> {image_uri}")
        else:
            _note(f"image_uris.retrieve skipped: the installed scikit-learn {installed} has no "
                  "SageMaker container tag (0.20.0 ... 1.5-2)")
        estimator = SKLearn(entry_point="train.py", framework_version=installed,
                            instance_type="ml.m5.large", role=role, sagemaker_session=sess,
                            hyperparameters={"max-depth": 3}, base_job_name="iris-sklearn")
        estimator.fit({"train": train_input}, logs=False)
        trained = estimator.latest_training_job
        assert trained is not None  # fit() sets it
        _note(f"SKLearn(entry_point='train.py', framework_version={installed!r}, ...)"
              f".fit({{'train': ...}}): job {trained.name} "
              f"{trained.describe()['TrainingJobStatus']}, no environment "
              "built (the installed release is the container's)", style="")
        for message in reported[shown:]:  # the estimator's role=, once
            _note(f"reported once: {message}", style="yellow")
        _note(f"model_data {estimator.model_data}")
        predictor = estimator.deploy(initial_instance_count=1, instance_type="ml.m5.large")
        predictor.serializer = CSVSerializer()
        rows = [0, 50, 100]  # one flower of each species
        labels = predictor.predict(iris.data[rows])
        _note(f"estimator.deploy() -> endpoint {predictor.endpoint_name}; with a CSVSerializer, "
              f"predict(iris.data[{rows}]) -> {np.asarray(labels).tolist()} "
              f"(labels {iris.target[rows].astype(float).tolist()})", style="")
        predictor.delete_endpoint()
        _note(f"predictor.delete_endpoint(): endpoint {predictor.endpoint_name} deleted")
        _generic_model(Model, image_uri, estimator.model_data, role, sess, iris.data,
                       JSONSerializer(), JSONDeserializer())
        _note(f"find them again: shoal {state.home_option()}jobs describe {trained.name}; "
              f"shoal {state.home_option()}endpoints list")
    finally:
        sess.close()


def _generic_model(model_cls: type, image_uri: str | None, model_data: str, role: str,
                   sess: object, iris_data: np.ndarray, serializer: object,
                   deserializer: object) -> None:
    model = model_cls(image_uri, model_data, role, sagemaker_session=sess)  # by position
    predictor = model.deploy(1, "ml.m5.large", serializer=serializer, deserializer=deserializer)
    try:
        rows = [1, 51, 101]
        answer = predictor.predict(iris_data[rows].tolist())
        _note(f"Model(image_uri, model_data, role) by position (image_uri {image_uri!r})"
              f".deploy(1, 'ml.m5.large') -> endpoint "
              f"{predictor.endpoint_name}; JSON predict(iris.data[{rows}]) -> {answer}",
              style="")
    finally:
        predictor.delete_endpoint()
