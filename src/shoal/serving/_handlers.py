"""What turns a request into a prediction: the ``Handler`` base (load / decode / predict /
encode, LitServe's shape), the handlers chosen from the artifact (ONNX, scikit-learn,
TorchScript), and ``select_handler``, which picks one for a model directory.

The handler for ``code/inference.py`` lives in ``script.py``. Heavy libraries are imported in
``load()``, which runs in the background after the server listens.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from shoal._internal.extras import require
from shoal.errors import ModelLoadError
from shoal.serving import codecs
from shoal.serving._options import ServerOptions, usable_cpus
from shoal.serving.http import RequestError, bad_request, model_error

__all__ = ["Handler", "OnnxHandler", "SklearnHandler", "TorchScriptHandler", "select_handler"]

log = logging.getLogger(__name__)


class Handler(abc.ABC):
    """Loads a model and answers requests: ``decode`` → ``predict`` (a batch) → ``encode``.

    ``__init__`` does no I/O; ``load`` does the heavy work. ``predict`` runs on the server's
    inference thread and returns one result per request: a prediction, or a ``RequestError``
    for that request alone.
    """

    kind: ClassVar[str]
    #: the extra that brings what ``load`` imports, and those modules (checked before loading)
    needs: ClassVar[tuple[str, tuple[str, ...]]] = ("serve", ())
    #: whether ``predict`` may be given several requests at once (decided by ``load``)
    batchable: bool = False
    #: request types ``decode`` understands (415 for others); None: the user's code decides
    content_types: tuple[str, ...] | None = codecs.SUPPORTED
    #: response types ``encode`` can write (406 for others); None: the user's code decides
    accepts: tuple[str, ...] | None = codecs.SUPPORTED
    #: whether a batch transform may pack several records into one request
    multi_record: bool = True

    def __init__(self, model_dir: Path, artifact: Path | None, options: ServerOptions) -> None:
        self.model_dir = model_dir
        self.artifact = artifact
        self.options = options

    @abc.abstractmethod
    def load(self) -> None:
        """Load the model (runs once, off the event loop)."""

    def decode(self, body: bytes, content_type: str, accept: str) -> Any:
        """The request's body as the model's input. Runs on the event loop (or, for large
        bodies, a helper thread): keep it to parsing; user code belongs in ``predict``."""
        return codecs.decode(body, content_type)

    @abc.abstractmethod
    def predict(self, batch: list[Any]) -> list[Any]:
        """One result per decoded request in *batch*."""

    def encode(self, prediction: Any, accept: str) -> tuple[bytes, str]:
        return codecs.encode(prediction, accept), accept

    def artifact_path(self) -> Path:
        if self.artifact is None:
            raise ModelLoadError(f"{self.kind} handler for {self.model_dir} has no model file",
                                 path=str(self.model_dir))
        return self.artifact

    def describe(self) -> str:
        name = self.artifact.name if self.artifact is not None else self.model_dir.name
        return f"{self.kind} ({name})"

    @property
    def model(self) -> Any:
        """The loaded model object (session, estimator or module), for ``inference.py``
        scripts that rely on shoal to load the artifact."""
        raise NotImplementedError


# --- ONNX ----------------------------------------------------------------------------------

def intra_op_threads(options: ServerOptions) -> int | None:
    """The intra-op thread count for a runtime (onnxruntime, torch): the option when set;
    with several workers, each process's share of the CPUs, so that every worker's runtime
    does not start one thread per core (which oversubscribes them); else the runtime's
    default (None)."""
    if options.intra_op_threads is not None:
        return options.intra_op_threads
    if options.workers is not None and options.workers > 1:
        return max(1, usable_cpus() // options.workers)
    return None


_ORT_DTYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16",
    "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(bool)": "bool",
    "tensor(string)": "object",
}


class OnnxHandler(Handler):
    """onnxruntime ``InferenceSession``; batches when every input's first axis is symbolic."""

    kind = "onnx"
    needs = ("serve", ("onnxruntime", "numpy"))

    def load(self) -> None:
        import numpy as np
        import onnxruntime as ort

        so = ort.SessionOptions()
        intra = intra_op_threads(self.options)
        if intra is not None:
            so.intra_op_num_threads = intra
        if self.options.inter_op_threads is not None:
            so.inter_op_num_threads = self.options.inter_op_threads
        # Spinning intra-op threads burn the cores the event loop needs between runs.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        available = ort.get_available_providers()
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                     if p in available]
        self._session = ort.InferenceSession(str(self.artifact_path()), so, providers=providers)
        inputs = self._session.get_inputs()
        self._names = [i.name for i in inputs]
        self._dtypes = [np.dtype(_ORT_DTYPES.get(i.type, "float32")) for i in inputs]
        self._shapes = [list(i.shape) for i in inputs]
        self._outputs = [o.name for o in self._session.get_outputs()]
        self.batchable = all(shape and not isinstance(shape[0], int) for shape in self._shapes)

    @property
    def model(self) -> Any:
        return self._session

    def decode(self, body: bytes, content_type: str, accept: str) -> dict[str, Any]:
        single = len(self._names) == 1
        # onnxruntime only reads its inputs: an x-npy body's memory is used as it is.
        data = codecs.decode(body, content_type, dtype=self._dtypes[0] if single else None,
                              writable=False)
        if single and not isinstance(data, dict):  # the common case
            return {self._names[0]: self._fit(data, self._dtypes[0], self._shapes[0])}
        if isinstance(data, dict):
            missing = [n for n in self._names if n not in data]
            if missing and not (single and len(data) == 1):
                raise bad_request(f"the model's inputs are {self._names}; the body lacks "
                                  f"{missing}")
            arrays = [data[n] if n in data else next(iter(data.values())) for n in self._names]
        else:
            raise bad_request(f"the model takes {len(self._names)} inputs {self._names}; send a "
                              f"JSON object with one array per input name")
        return {name: self._fit(arr, dtype, shape) for name, arr, dtype, shape
                in zip(self._names, arrays, self._dtypes, self._shapes, strict=True)}

    @staticmethod
    def _fit(arr: Any, dtype: Any, shape: list[Any]) -> Any:
        if arr.dtype != dtype:
            try:
                arr = arr.astype(dtype)
            except (TypeError, ValueError) as e:
                raise bad_request(f"cannot convert the input to {dtype}: {e}") from None
        # A row of features (CSV, flat JSON) for a model that takes images and the like: give
        # it the model's fixed trailing shape when the sizes agree.
        trailing = shape[1:]
        if (arr.ndim != len(shape) and trailing and all(isinstance(d, int) for d in trailing)
                and arr.ndim >= 1):
            per_row = 1
            for d in trailing:
                per_row *= d
            if per_row and arr.size % per_row == 0:
                arr = arr.reshape(-1, *trailing)
        return arr

    def predict(self, batch: list[Any]) -> list[Any]:
        if len(batch) == 1:
            return [self._run_one(batch[0])]
        results: list[Any] = [None] * len(batch)
        if len(self._names) == 1:  # the common case: one input, every request the same shape
            name = self._names[0]
            first = batch[0][name]
            tail, dtype = first.shape[1:], first.dtype
            if first.ndim and all(f[name].ndim and f[name].shape[1:] == tail
                                  and f[name].dtype == dtype for f in batch):
                self._run_group(batch, range(len(batch)), results)
                return results
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, feed in enumerate(batch):
            arrays = feed.values()
            if any(a.ndim == 0 for a in arrays):
                results[i] = self._run_one(feed)
                continue
            key = tuple((a.shape[1:], a.dtype.str) for a in arrays)
            groups.setdefault(key, []).append(i)
        for idxs in groups.values():
            if len(idxs) == 1:
                results[idxs[0]] = self._run_one(batch[idxs[0]])
            else:
                self._run_group(batch, idxs, results)
        return results

    def _run_group(self, batch: list[Any], idxs: Sequence[int], results: list[Any]) -> None:
        """Run the requests *idxs* (same trailing shapes and dtypes) as one batch; each gets
        its rows of every output in *results*."""
        import numpy as np

        rows = [batch[i][self._names[0]].shape[0] for i in idxs]
        total = sum(rows)
        try:
            feed = {n: np.concatenate([batch[i][n] for i in idxs]) for n in self._names}
            outs = self._session.run(None, feed)
            if any(o.ndim == 0 or o.shape[0] != total for o in outs):
                raise ValueError("an output's first axis is not the batch")
        except Exception:  # one bad request must not fail the others: run each alone
            for i in idxs:
                results[i] = self._run_one(batch[i])
            return
        start = 0
        for i, n in zip(idxs, rows, strict=True):
            results[i] = [o[start:start + n] for o in outs]
            start += n

    def _run_one(self, feed: dict[str, Any]) -> Any:
        try:
            return self._session.run(None, feed)
        except Exception as e:  # onnxruntime's Fail/InvalidArgument carry the model's message
            return model_error(e)

    def encode(self, prediction: Any, accept: str) -> tuple[bytes, str]:
        value = prediction[0] if len(prediction) == 1 else dict(
            zip(self._outputs, prediction, strict=True))
        return codecs.encode(value, accept), accept


# --- scikit-learn --------------------------------------------------------------------------

class SklearnHandler(Handler):
    """A fitted estimator from ``model.joblib``/``model.pkl`` (joblib) or ``.skops``;
    answers ``estimator.predict(rows)``."""

    kind = "sklearn"
    needs = ("sklearn", ("sklearn", "joblib"))

    def load(self) -> None:
        path = self.artifact_path()
        if path.suffix == ".skops":
            try:
                import skops.io as sio
            except ImportError as e:
                raise ModelLoadError(f"{path} needs skops to load; pip install skops",
                                     path=str(path)) from e
            # The deployer chose this file; trusting its types is the trust joblib implies.
            self._model = sio.load(path, trusted=sio.get_untrusted_types(file=path))
        else:
            import joblib

            # joblib is pickle: acceptable for the model file its owner deploys, never used on
            # request bodies.
            self._model = joblib.load(path)
        if not callable(getattr(self._model, "predict", None)):
            raise ModelLoadError(f"{path.name} holds a {type(self._model).__name__}, "
                                 f"which has no predict(); deploy a fitted estimator or add "
                                 f"code/inference.py", path=str(path))

    @property
    def model(self) -> Any:
        return self._model

    def decode(self, body: bytes, content_type: str, accept: str) -> Any:
        data = codecs.decode(body, content_type)
        if isinstance(data, dict):
            raise bad_request("scikit-learn models take one array of rows; send a JSON array "
                              "(or {\"instances\": [...]})")
        return data.reshape(1, -1) if data.ndim == 1 else data

    def predict(self, batch: list[Any]) -> list[Any]:
        out = []
        for rows in batch:
            try:
                out.append(self._model.predict(rows))
            except Exception as e:  # the estimator's own message (shape, dtype) is the answer
                out.append(model_error(e))
        return out


# --- TorchScript ---------------------------------------------------------------------------

class TorchScriptHandler(Handler):
    """A module saved with ``torch.jit.save`` (``model.pt``/``model.pth``)."""

    kind = "torchscript"
    needs = ("torch", ("torch",))

    def load(self) -> None:
        import torch

        threads = intra_op_threads(self.options)
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            module = torch.jit.load(str(self.artifact_path()),  # type: ignore[no-untyped-call]  # torch.jit.load is unannotated
                                    map_location="cpu")
            self._module = module.eval()
        except RuntimeError as e:
            raise ModelLoadError(f"{self.artifact_path().name} is not a TorchScript archive ({e}); save "
                                 f"the model with torch.jit.script(model).save(path), or add "
                                 f"code/inference.py with a model_fn",
                                 path=str(self.artifact_path())) from e

    @property
    def model(self) -> Any:
        return self._module

    def predict(self, batch: list[Any]) -> list[Any]:
        import numpy as np
        import torch

        out = []
        for data in batch:
            try:
                if isinstance(data, dict):
                    raise bad_request("TorchScript models take one array")
                if data.dtype == np.float64:
                    data = data.astype(np.float32)
                with torch.inference_mode():
                    result = self._module(torch.from_numpy(np.ascontiguousarray(data)))
                out.append(_to_numpy(result))
            except RequestError as e:
                out.append(e)
            except Exception as e:  # torch's RuntimeError says which shape it wanted
                out.append(model_error(e))
        return out


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    if isinstance(value, dict):
        return {k: _to_numpy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return {f"output_{i}": _to_numpy(v) for i, v in enumerate(value)}
    return value


# --- choosing ------------------------------------------------------------------------------

#: (handler, exact file names, suffixes a lone file may have), in order of preference.
_AUTO: tuple[tuple[type[Handler], tuple[str, ...], tuple[str, ...]], ...] = (
    (OnnxHandler, ("model.onnx",), (".onnx",)),
    (SklearnHandler, ("model.joblib", "model.pkl", "model.skops"), (".joblib", ".pkl", ".skops")),
    (TorchScriptHandler, ("model.pt", "model.pth"), (".pt", ".pth")),
)


def find_artifact(model_dir: Path) -> tuple[type[Handler], Path] | None:
    """The handler class and model file for *model_dir*'s artifact, or None."""
    for cls, names, _ in _AUTO:
        for name in names:
            if (model_dir / name).is_file():
                return cls, model_dir / name
    for cls, _, suffixes in _AUTO:
        found = sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix in suffixes)
        if len(found) == 1:
            return cls, found[0]
    return None


def select_handler(model_dir: Path, options: ServerOptions) -> Handler:
    """The handler for *model_dir*: ``code/inference.py`` first, else one for its artifact.

    Raises ``ModelLoadError`` naming the files found when there is neither.
    """
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {model_dir} does not exist", path=str(model_dir))
    script = model_dir / "code" / "inference.py"
    if script.is_file():
        from shoal.serving.script import ScriptHandler

        return ScriptHandler(model_dir, script, options)
    found = find_artifact(model_dir)
    if found is None:
        listing = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*")
                         if p.is_file())[:30]
        raise ModelLoadError(
            f"{model_dir} holds no model this server recognises and no code/inference.py; "
            f"found {listing or 'no files'}. Add model.onnx, model.joblib/model.pkl/"
            f"model.skops (scikit-learn), model.pt (TorchScript), or code/inference.py with "
            f"model_fn/predict_fn", path=str(model_dir), files=listing)
    cls, artifact = found
    extra, modules = cls.needs
    require(extra, f"serving {artifact.name} ({cls.kind})", *modules)
    return cls(model_dir, artifact, options)
