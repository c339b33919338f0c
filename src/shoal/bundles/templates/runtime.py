"""The model runtime every shoal bundle carries: load the ONNX model and answer one request.

Standard library, numpy and onnxruntime only: a bundle never imports shoal. ``shoal bundle
build`` inlines this module into each target's entry file (``function_app.py``,
``lambda_function.py``, ``app.py``, ``serve.py``), so a bundle is one Python file and a model.

Requests: JSON ``{"data": [...]}`` (one sample or a batch; a bare JSON array works too, and
``"raw": true`` or ``?raw=1`` adds every model output), CSV rows (``text/csv``) or a NumPy
array (``application/x-npy``, never unpickled). Answers: JSON, e.g. ``{"digits": [7, 2]}``.
A request the model cannot take is answered 400 (415 for an unknown content type) with
``{"error": "..."}``, never a crash. No ``from __future__ import annotations``: Azure's worker
reads the entry function's annotations as types.
"""

import io
import json
import logging
import math
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

MODEL_DIR = Path(__file__).resolve().parent / "model"
_TRUE = ("1", "true", "yes")
_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
           "int64": np.int64, "int32": np.int32, "int8": np.int8, "uint8": np.uint8,
           "bool": np.bool_, "string": np.object_}
_log = logging.getLogger("bundle")


class BadRequest(Exception):
    """A request the model cannot answer: the entry points turn it into an HTTP 4xx."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class BundledModel:
    """The ONNX model of ``model/`` and its ``bundle.json`` (inputs, outputs, mapping)."""

    def __init__(self, model_dir: Path = MODEL_DIR) -> None:
        self.config = json.loads((model_dir / "bundle.json").read_text(encoding="utf-8"))
        options = ort.SessionOptions()
        if self.config.get("weights") == "int8":
            # The weights are stored as int8 (a DequantizeLinear each) to keep the bundle
            # small. Without this onnxruntime would fuse them into slower quantized kernels;
            # with it they are folded back to float32 once, at load: float compute throughout.
            options.add_session_config_entry("session.disable_quant_qdq", "1")
        self.session = ort.InferenceSession(str(model_dir / self.config["model_file"]),
                                            options, providers=["CPUExecutionProvider"])
        self.inputs: list[dict[str, Any]] = self.config["inputs"]
        self.outputs: list[dict[str, Any]] = self.config["outputs"]

    def info(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.config.get("name"), "inputs": self.inputs,
                "outputs": self.outputs, "output_map": self.config["output_map"],
                "output_key": self.config["output_key"]}

    def predict(self, data: Any, *, raw: bool = False) -> dict[str, Any]:
        feeds = self._feeds(data)
        names = [o["name"] for o in self.outputs]
        try:
            values = self._run(names, feeds)
        except InvalidArgument as e:  # shapes or types the graph rejects
            raise BadRequest(f"the model rejected the input: {e}") from None
        result = {self.config["output_key"]: self._mapped(values)}
        if raw:
            result["outputs"] = {name: _jsonable(v) for name, v in zip(names, values, strict=True)}
        return result

    def _run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        batch = self.inputs[0]["shape"][0] if self.inputs[0]["shape"] else None
        first = next(iter(feeds.values()))
        if not isinstance(batch, int) or first.ndim == 0 or first.shape[0] == batch:
            return list(self.session.run(names, feeds))
        # A model exported with a fixed batch size: run the request in slices of that size.
        if first.shape[0] % batch:
            raise BadRequest(f"this model takes batches of exactly {batch} samples; got "
                             f"{first.shape[0]}")
        parts = [self.session.run(names, {k: v[i:i + batch] for k, v in feeds.items()})
                 for i in range(0, first.shape[0], batch)]
        return [np.concatenate([p[j] for p in parts]) for j in range(len(names))]

    def _feeds(self, data: Any) -> dict[str, np.ndarray]:
        if len(self.inputs) == 1 and not isinstance(data, dict):
            spec = self.inputs[0]
            return {spec["name"]: _as_input(data, spec)}
        if not isinstance(data, dict):
            raise BadRequest("this model has several inputs; send \"data\" as an object "
                             f"with one array per input: {[i['name'] for i in self.inputs]}")
        missing = [i["name"] for i in self.inputs if i["name"] not in data]
        if missing:
            raise BadRequest(f"\"data\" lacks the model input(s) {missing}")
        return {i["name"]: _as_input(data[i["name"]], i) for i in self.inputs}

    def _mapped(self, values: list[np.ndarray]) -> Any:
        names = [o["name"] for o in self.outputs]
        value = values[names.index(self.config["mapped_output"])]
        if self.config["output_map"] == "argmax":
            return value.argmax(axis=-1).tolist()
        return _jsonable(value)


def _jsonable(value: np.ndarray) -> Any:
    out = value.tolist()
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        out = _finite(out)
    return out


def _finite(v: Any) -> Any:
    """JSON has no NaN or infinity: they travel as null."""
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v if math.isfinite(v) else None


def _as_input(data: Any, spec: dict[str, Any]) -> np.ndarray:
    """*data* as a batch for input *spec*: one sample or several, flat or shaped."""
    dtype = np.dtype(_DTYPES.get(spec["dtype"], np.float32))
    try:
        array = np.asarray(data)
        if dtype.kind != "O" and array.dtype.kind not in "biuf":  # nulls, strings, objects
            raise ValueError(f"found {array.dtype.name} values")
        array = array.astype(dtype, copy=False)
    except (ValueError, TypeError) as e:
        raise BadRequest(f"input {spec['name']!r} must be a (nested) list of numbers of one "
                         f"shape ({spec['dtype']}): {e}") from None
    shape = spec["shape"]
    if not shape:
        return array
    sample = shape[1:]
    if not all(isinstance(d, int) for d in sample):  # symbolic sample dims: take it as sent
        return array if array.ndim == len(shape) else array[np.newaxis]
    size = math.prod(sample)
    if array.size == 0 or array.size % size:
        raise BadRequest(f"input {spec['name']!r} takes samples of shape {sample} ({size} "
                         f"values each); got {array.size} value(s) in shape {list(array.shape)}")
    return array.reshape(-1, *sample)


def decode(body: bytes, content_type: str | None,
           query: Mapping[str, str] | None = None) -> tuple[Any, bool]:
    """The request's data and whether the raw outputs were asked for."""
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    raw = str((query or {}).get("raw", "")).lower() in _TRUE
    if kind in ("application/json", "text/json", "text/plain", ""):
        try:
            payload = json.loads(body or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadRequest(f"the body is not valid JSON: {e}") from None
        if isinstance(payload, list):
            return payload, raw
        if not isinstance(payload, dict) or "data" not in payload:
            raise BadRequest('send a JSON object {"data": [...]} (one sample or a batch); '
                             '"raw": true adds the model\'s outputs')
        return payload["data"], raw or payload.get("raw") is True
    if kind == "text/csv":
        try:
            return np.loadtxt(io.StringIO(body.decode()), delimiter=",", ndmin=2), raw
        except (UnicodeDecodeError, ValueError) as e:
            raise BadRequest(f"the body is not CSV rows of numbers: {e}") from None
    if kind == "application/x-npy":
        try:
            return np.load(io.BytesIO(body), allow_pickle=False), raw
        except (ValueError, OSError, EOFError) as e:
            raise BadRequest(f"the body is not a .npy array (pickles are refused): {e}") from None
    raise BadRequest(f"content type {kind!r} is not supported; use application/json, text/csv "
                     "or application/x-npy", status=415)


_model: BundledModel | None = None
_model_lock = threading.Lock()


def get_model() -> BundledModel:
    """The bundled model, loaded once per process."""
    global _model
    with _model_lock:
        if _model is None:
            _model = BundledModel()
        return _model


def handle(body: bytes, content_type: str | None,
           query: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    """Answer one request: ``(HTTP status, JSON body)``; never raises."""
    try:
        data, raw = decode(body, content_type, query)
        result: dict[str, Any] = get_model().predict(data, raw=raw)
        status = 200
    except BadRequest as e:
        result, status = {"error": str(e)}, e.status
    except Exception:  # a bug or a broken model: logged, answered 500, the process lives on
        _log.exception("inference failed")
        result, status = {"error": "internal error while running the model (see the log)"}, 500
    return status, json.dumps(result, separators=(",", ":")).encode()
