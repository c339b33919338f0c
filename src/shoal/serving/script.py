"""The handler for ``code/inference.py``: SageMaker inference-toolkit functions.

``model_fn(model_dir[, context])``, ``input_fn(body, content_type[, context])``,
``predict_fn(data, model[, context])``, ``output_fn(prediction, accept[, context])``, or
``transform_fn(model, body, content_type, accept[, context])`` in their place. A function that
takes one more positional parameter than listed gets the ``context``. Missing functions fall
back to shoal's: the artifact beside the script is loaded as if there were no script, JSON/
CSV/npy are decoded and encoded, and ``predict_fn`` calls the model.

``predict_fn`` batches when the module sets ``BATCHABLE = True`` or the function has
``predict_fn.batchable = True``: it then takes a list of inputs and returns a list.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from shoal.errors import ModelLoadError
from shoal.serving import codecs
from shoal.serving._handlers import Handler, find_artifact
from shoal.serving.http import RequestError, bad_request, model_error

__all__ = ["InferenceContext", "ScriptHandler", "ScriptRequest"]

log = logging.getLogger(__name__)

_FUNCTIONS = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")


@dataclass(frozen=True, slots=True)
class InferenceContext:
    """What handler functions that ask for a ``context`` receive (MMS's ``Context``, reduced).

    ``system_properties`` has ``model_dir``, ``gpu_id`` (None on CPU), ``batch_size`` and
    ``server_name``.
    """

    model_dir: str
    system_properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScriptRequest:
    """A request for the script, decoded on the inference thread (input_fn is user code)."""

    body: bytes
    content_type: str
    accept: str


class _Call:
    """A user function, called with the context when it takes one more parameter."""

    def __init__(self, fn: Callable[..., Any], n_args: int, context: InferenceContext) -> None:
        self.fn = fn
        self.context = context
        self.with_context = _positional_count(fn) > n_args

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args, self.context) if self.with_context else self.fn(*args)


def _positional_count(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 0
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


class ScriptHandler(Handler):
    kind = "inference.py"
    multi_record = False

    def load(self) -> None:
        script = self.artifact_path()
        module = _import_script(script)
        fns = {name: getattr(module, name, None) for name in _FUNCTIONS}
        size, _ = self.options.batch_limits(batchable=True)
        context = InferenceContext(str(self.model_dir), {
            "model_dir": str(self.model_dir), "gpu_id": None, "batch_size": size,
            "server_name": "shoal"})
        self._model = self._load_model(fns["model_fn"], context)
        self._transform = _Call(fns["transform_fn"], 4, context) if fns["transform_fn"] else None
        self._input = _Call(fns["input_fn"], 2, context) if fns["input_fn"] else None
        self._output = _Call(fns["output_fn"], 2, context) if fns["output_fn"] else None
        predict = fns["predict_fn"]
        self._predict = _Call(predict, 2, context) if predict else None
        self.batchable = bool(self._transform is None and predict is not None and (
            getattr(module, "BATCHABLE", False) or getattr(predict, "batchable", False)))
        if self._transform is not None or self._input is not None:
            self.content_types = None
        if self._transform is not None or self._output is not None:
            self.accepts = None
        defined = [n for n, f in fns.items() if f is not None]
        log.info("code/inference.py defines %s%s", ", ".join(defined) or "nothing",
                 " (predict_fn batches)" if self.batchable else "")

    def _load_model(self, model_fn: Callable[..., Any] | None, context: InferenceContext) -> Any:
        if model_fn is not None:
            return _Call(model_fn, 1, context)(str(self.model_dir))
        found = find_artifact(self.model_dir)
        if found is None:
            raise ModelLoadError(f"code/inference.py in {self.model_dir} defines no model_fn and "
                                 f"the directory holds no model file shoal can load; define "
                                 f"model_fn(model_dir)", path=str(self.model_dir))
        cls, artifact = found
        self._auto = cls(self.model_dir, artifact, self.options)
        self._auto.load()
        return self._auto.model

    @property
    def model(self) -> Any:
        return self._model

    def decode(self, body: bytes, content_type: str, accept: str) -> ScriptRequest:
        # input_fn is user code: it runs on the inference thread, in predict().
        return ScriptRequest(body, content_type, accept)

    def predict(self, batch: list[ScriptRequest]) -> list[Any]:
        if self._transform is not None:
            return [self._transform_one(r) for r in batch]
        decoded = [self._decode(r) for r in batch]
        ok = [i for i, d in enumerate(decoded) if not isinstance(d, RequestError)]
        predictions: list[Any] = list(decoded)
        if self.batchable and ok:
            try:
                outs = self._predict_fn([decoded[i] for i in ok])
                if not isinstance(outs, list | tuple) or len(outs) != len(ok):
                    raise TypeError(f"a batchable predict_fn must return a list with one result "
                                    f"per input; given {len(ok)} inputs it returned "
                                    f"{type(outs).__name__}"
                                    f"{f' of {len(outs)}' if hasattr(outs, '__len__') else ''}")
                for i, out in zip(ok, outs, strict=True):
                    predictions[i] = out
            except Exception as e:  # the user's predict_fn failed the whole batch
                for i in ok:
                    predictions[i] = model_error(e)
        else:
            for i in ok:
                try:
                    predictions[i] = self._predict_fn(decoded[i])
                except Exception as e:  # the model's message goes back to the client
                    predictions[i] = model_error(e)
        return [p if isinstance(p, RequestError) else self._encode(p, r.accept)
                for p, r in zip(predictions, batch, strict=True)]

    def encode(self, prediction: Any, accept: str) -> tuple[bytes, str]:
        body, content_type = prediction  # output_fn already ran, in predict()
        return body, content_type

    def _decode(self, r: ScriptRequest) -> Any:
        if self._input is None:
            try:
                return codecs.decode(r.body, r.content_type)
            except RequestError as e:
                return e
        try:
            return self._input(r.body, r.content_type)
        except Exception as e:  # the script could not make sense of this body
            return bad_request(f"input_fn failed: {type(e).__name__}: {e}")

    def _predict_fn(self, data: Any) -> Any:
        if self._predict is not None:
            return self._predict(data, self._model)
        return _default_predict(data, self._model)

    def _encode(self, prediction: Any, accept: str) -> Any:
        try:
            if self._output is None:
                return codecs.encode(prediction, accept), accept
            return _response(self._output(prediction, accept), accept)
        except RequestError as e:
            return e
        except Exception as e:  # output_fn is model code too
            return model_error(e)

    def _transform_one(self, r: ScriptRequest) -> Any:
        transform = self._transform
        if transform is None:
            raise RuntimeError("transform_one without a transform_fn")
        try:
            return _response(transform(self._model, r.body, r.content_type, r.accept), r.accept)
        except Exception as e:  # transform_fn is the whole model
            return model_error(e)


def _response(result: Any, accept: str) -> tuple[bytes, str]:
    content_type = accept
    if isinstance(result, tuple) and len(result) == 2:  # (body, content type), as SageMaker
        result, content_type = result
    if isinstance(result, str):
        result = result.encode()
    elif isinstance(result, bytearray | memoryview):
        result = bytes(result)
    elif not isinstance(result, bytes):
        return codecs.encode(result, content_type), content_type
    return result, content_type


def _default_predict(data: Any, model: Any) -> Any:
    import numpy as np

    if type(model).__name__ == "InferenceSession":  # onnxruntime, loaded from the artifact
        first = model.get_inputs()[0]
        dtype = np.float32 if first.type == "tensor(float)" else None
        outs = model.run(None, {first.name: np.asarray(data, dtype=dtype)})
        return outs[0] if len(outs) == 1 else outs
    if callable(getattr(model, "predict", None)):
        return model.predict(data)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        x = torch.as_tensor(np.asarray(data, dtype=np.float32))
        with torch.inference_mode():
            out = model(x)
        return out.detach().cpu().numpy() if hasattr(out, "detach") else out
    if callable(model):
        return model(data)
    raise TypeError(f"the model from model_fn is a {type(model).__name__}, which is not "
                    f"callable and has no predict(); define predict_fn in code/inference.py")


def _import_script(script: Path) -> ModuleType:
    code_dir = str(script.parent)
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)  # the script imports its siblings, as in SageMaker
    spec = importlib.util.spec_from_file_location("inference", script)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot import {script}", path=str(script))
    module = importlib.util.module_from_spec(spec)
    sys.modules["inference"] = module  # pickles made by the script can find their classes
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop("inference", None)
        raise ModelLoadError(f"importing {script} failed: {type(e).__name__}: {e}",
                             path=str(script)) from e
    return module

