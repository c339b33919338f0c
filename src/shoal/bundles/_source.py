"""Where a bundle's model comes from: a directory or file, a ``model.tar.gz`` URI, or a training
job's name; and what it is (ONNX as it is, scikit-learn converted to ONNX with skl2onnx).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shoal._internal.extras import require
from shoal.bundles._options import (
    SUPPORTED_MODEL_TYPES,
    BundleTarget,
    ModelType,
    supported_types_text,
)
from shoal.errors import (
    InvalidArgumentError,
    JobNotFound,
    ModelNotFound,
)

if TYPE_CHECKING:
    import numpy as np

    from shoal.session import Session

__all__ = ["SourceModel", "fetch", "load"]

_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_TARBALL = (".tar.gz", ".tgz", ".tar")
_SKLEARN_FILES = ("model.joblib", "model.pkl", "model.pickle")
#: Recognised but not bundled, for the error message: (glob, type, what to do).
_OTHER_TYPES = (
    ("*.pt", "pytorch", "export it to ONNX first: torch.onnx.export(model, example, "
                        "'model.onnx', dynamo=False)"),
    ("*.pth", "pytorch", "export it to ONNX first: torch.onnx.export(model, example, "
                         "'model.onnx', dynamo=False)"),
    ("*.safetensors", "hugging-face", "export it to ONNX first (optimum-cli export onnx)"),
    ("saved_model.pb", "tensorflow", "convert it to ONNX first (python -m tf2onnx.convert)"),
    ("*.keras", "keras", "convert it to ONNX first (tf2onnx)"),
    ("*.ubj", "xgboost", "convert it to ONNX first (onnxmltools)"),
)


@dataclass(frozen=True, slots=True)
class SourceModel:
    """The model a bundle is built from, as ONNX, and how to ask the original for outputs."""

    type: ModelType
    file: Path
    origin: str
    onnx: bytes
    #: The original model's outputs on inputs, by ONNX output name (only those it can give);
    #: None: the ONNX model is the original.
    reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None


def fetch(model: str | os.PathLike[str], *, workdir: Path, session: Session | None = None) -> Path:
    """A local directory or file holding the model named by *model*."""
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.exists():
        return _unpack(path, workdir, session) if path.name.endswith(_TARBALL) else path
    if "://" in text:
        return _unpack(_download(text, workdir, session), workdir, session)
    if _JOB_NAME.match(text):
        return _unpack(_download(_job_model_data(text, session), workdir, session), workdir,
                       session)
    raise ModelNotFound(f"model {text!r} is not a directory, a file, a model.tar.gz URI or a "
                        "training job's name", model=text)


def _current(session: Session | None) -> Session:
    if session is not None:
        return session
    from shoal.session import current

    return current()


def _job_model_data(name: str, session: Session | None) -> str:
    from shoal.core.jobs import JobStatus, TrainingSpec

    session = _current(session)
    try:
        record = session.jobs.get(name)
    except JobNotFound:
        raise ModelNotFound(f"model {name!r} is not a directory, a file, a model.tar.gz URI "
                            "or the name of a training job ('shoal jobs list' shows jobs)",
                            model=name) from None
    training: TrainingSpec | None = record.spec.training
    if training is None:
        raise InvalidArgumentError(f"job {name} is not a training job, so it has no model; "
                                   "name a training job, a model directory or a model.tar.gz",
                                   job=name)
    if record.status != JobStatus.COMPLETED:
        raise InvalidArgumentError(f"training job {name} is {record.status}; it has a model "
                                   f"only once it completed (shoal jobs describe {name})",
                                   job=name)
    # The same place TrainingJob.model_data names (shoal.training sits beside this layer).
    return training.model_data(name, str(session.artifacts.root))


def _download(uri: str, workdir: Path, session: Session | None) -> Path:
    from shoal.storage import FsspecArtifactStore

    parent, _, name = uri.rstrip("/").rpartition("/")
    local = workdir / "download" / name
    local.parent.mkdir(parents=True, exist_ok=True)
    store = _current(session).artifacts
    root = str(store.root).rstrip("/")
    if uri.startswith(root + "/"):
        store.get_file(uri[len(root) + 1:], local)  # the session's storage options apply
    else:
        FsspecArtifactStore.open(parent).get_file(name, local)
    return local


def _unpack(path: Path, workdir: Path, session: Session | None) -> Path:
    from shoal._internal.archives import ExtractLimits, extract_tar

    if not path.name.endswith(_TARBALL):
        return path
    dest = workdir / "unpacked"
    # Caps on size and file count (the session's, else SHOAL_MAX_EXTRACT_*), checked while
    # extracting; no absolute paths, links out or devices; nothing left behind on failure.
    limits = ExtractLimits.from_settings(session.settings) if session is not None else None
    extract_tar(path, dest, limits=limits, label=f"the model archive {path.name} ({path})")
    return dest


def load(path: Path, *, origin: str, target: BundleTarget) -> SourceModel:
    """The model at *path* (a directory or a file) as ONNX, or an error naming what is taken."""
    kind, file, hint = _detect(path)
    if kind not in SUPPORTED_MODEL_TYPES[target]:
        what = f"a {kind} model ({file.name})" if file is not None else "no model file"
        raise InvalidArgumentError(
            f"{origin} holds {what}; {target} bundles take: {supported_types_text(target)}"
            + (f". To bundle it, {hint}" if hint else ""),
            model=origin, model_type=str(kind), target=str(target))
    model_file = file if file is not None else path
    if kind == ModelType.ONNX:
        return SourceModel(ModelType.ONNX, model_file, origin, model_file.read_bytes())
    return _from_sklearn(model_file, origin)


def _detect(path: Path) -> tuple[ModelType | str, Path | None, str | None]:
    if path.is_file():
        if path.suffix == ".onnx":
            return ModelType.ONNX, path, None
        if path.suffix in (".joblib", ".pkl", ".pickle"):
            return ModelType.SKLEARN, path, None
        files = [path]
    else:
        if (path / "model.onnx").is_file():
            return ModelType.ONNX, path / "model.onnx", None
        found = sorted(path.rglob("*.onnx"))
        if len(found) > 1:
            names = ", ".join(str(f.relative_to(path)) for f in found)
            raise InvalidArgumentError(f"{path} holds several ONNX files ({names}); name one "
                                       "of them as the model", path=str(path))
        if found:
            return ModelType.ONNX, found[0], None
        for name in _SKLEARN_FILES:
            if (path / name).is_file():
                return ModelType.SKLEARN, path / name, None
        joblibs = sorted(path.glob("*.joblib"))
        if len(joblibs) == 1:
            return ModelType.SKLEARN, joblibs[0], None
        files = sorted(f for f in path.rglob("*") if f.is_file())
    for pattern, kind, hint in _OTHER_TYPES:
        for f in files:
            if f.match(pattern):
                return kind, f, hint
    return "unknown", None, None


def _from_sklearn(file: Path, origin: str) -> SourceModel:
    """Convert a pickled scikit-learn estimator to ONNX (the bundle then needs no sklearn).

    The file is unpickled: only build bundles from models you trust, as with any pickle.
    """
    require("sklearn", "bundling a scikit-learn model", "joblib", "skl2onnx", "sklearn")
    import joblib
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.base import is_classifier
    estimator = joblib.load(file)
    features = getattr(estimator, "n_features_in_", None)
    if not hasattr(estimator, "predict") or features is None:
        raise InvalidArgumentError(f"{file.name} in {origin} is a {type(estimator).__name__}, "
                                   "not a fitted scikit-learn estimator", model=origin)
    classifier = is_classifier(estimator)
    try:
        onx = to_onnx(estimator, initial_types=[("X", FloatTensorType([None, int(features)]))],
                      options={"zipmap": False} if classifier else None)
    except Exception as e:  # skl2onnx raises bare RuntimeError/NameError for the unconvertible
        raise InvalidArgumentError(f"skl2onnx cannot convert the {type(estimator).__name__} "
                                   f"in {file.name}: {e}", model=origin) from e
    names = [o.name for o in onx.graph.output]

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = next(iter(feeds.values()))
        if classifier:
            out = {names[0]: estimator.predict(x)}
            if len(names) > 1 and hasattr(estimator, "predict_proba"):
                out[names[1]] = estimator.predict_proba(x)
            return out
        return {names[0]: estimator.predict(x).reshape(len(x), -1)}

    return SourceModel(ModelType.SKLEARN, file, origin, onx.SerializeToString(), reference)
