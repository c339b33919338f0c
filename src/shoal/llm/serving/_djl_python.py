"""A stand-in for DJL's ``djl_python`` package (``Input``, ``Output``, ``PairList``), for
``option.entryPoint`` handlers written against DJL Serving's Python engine::

    from djl_python import Input, Output

    def handle(inputs: Input) -> Output | None:
        if inputs.is_empty():               # the initialisation call, at load
            init(inputs.get_properties())   # serving.properties' option.* keys, unprefixed
            return None
        return Output().add_as_json({"echo": inputs.get_as_json()})

The classes follow djl-serving's ``engines/python/setup/djl_python`` (``inputs.py``,
``outputs.py``, ``pair_list.py``): the same method names, arguments and results, so a handler
runs unchanged under DJL and under shoal. They are registered under the name ``djl_python``
(and ``djl_python.inputs``, ``.outputs``, ``.pair_list``) only when the real package is not
installed, and only while shoal serves such an entry point (``register``/``unregister``);
importing shoal never installs them. Not provided: DJL's socket protocol (``read``/``encode``),
the ``tensor/ndlist`` codec (``get_as_numpy``/``add_as_numpy``), streaming outputs and
session management.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
from types import ModuleType
from typing import Any

__all__ = ["Input", "Output", "PairList", "djl_module", "register", "unregister"]

_NAMES = ("djl_python", "djl_python.inputs", "djl_python.outputs", "djl_python.pair_list")


class PairList:
    """An ordered list of ``(key, value)`` pairs; keys may repeat or be ``None``."""

    def __init__(self, keys: list[Any] | None = None, values: list[Any] | None = None,
                 pair_list: list[tuple[Any, Any]] | None = None,
                 pair_map: dict[Any, Any] | None = None) -> None:
        self.keys: list[Any] = []
        self.values: list[Any] = []
        if keys and values:
            if len(keys) != len(values):
                raise ValueError("key value size mismatch.")
            self.keys, self.values = list(keys), list(values)
        for key, value in (pair_list or []):
            self.keys.append(key)
            self.values.append(value)
        for key, value in (pair_map or {}).items():
            self.keys.append(key)
            self.values.append(value)

    def add(self, key: Any = None, value: Any = None, index: int | None = None,
            pair: tuple[Any, Any] | None = None) -> None:
        if index is not None and value is not None:
            self.keys.insert(index, key)
            self.values.insert(index, value)
        elif pair is not None:
            self.keys.append(pair[0])
            self.values.append(pair[1])
        elif value is not None:
            self.keys.append(key)
            self.values.append(value)

    def add_all(self, other: PairList | None) -> None:
        if other:
            self.keys.extend(other.get_keys())
            self.values.extend(other.get_values())

    def size(self) -> int:
        return len(self.keys)

    def is_empty(self) -> bool:
        return self.size() == 0

    def get(self, key: Any) -> Any:
        if key not in self.keys:
            return None
        return self.values[self.keys.index(key)]

    def key_at(self, index: int) -> Any:
        return self.keys[index]

    def value_at(self, index: int) -> Any:
        return self.values[index]

    def get_keys(self) -> list[Any]:
        return self.keys

    def get_values(self) -> list[Any]:
        return self.values


class Input:
    """One request (or, when ``is_empty()``, the initialisation call): ``properties`` hold the
    request's headers (or, at initialisation, the model's properties); ``content`` holds the
    body under the key ``data``."""

    def __init__(self) -> None:
        self.function_name: str | None = None
        self.properties: dict[str, Any] = {}
        self.content = PairList()

    def __str__(self) -> str:
        text = "properties: " + str(self.get_properties())
        for key in self.get_content().get_keys():
            text += f"\n{key}: {self.get_data(key)}"
        return text

    def is_batch(self) -> bool:
        return self.get_batch_size() > 1

    def get_batch_size(self) -> int:
        return int(self.properties.get("batch_size", "1"))

    def get_batches(self) -> list[Input]:
        """The requests of a batch (``[self]`` for one request: shoal sends one at a time)."""
        size = self.get_batch_size()
        if size <= 1:
            return [self]
        batch = [Input() for _ in range(size)]
        for i, item in enumerate(batch):
            prefix = f"batch_{i}."
            for key, value in self.properties.items():
                if key.startswith(prefix):
                    item.properties[key[len(prefix):]] = value
                elif not key.startswith("batch_"):
                    item.properties[key] = value
        pattern = re.compile(r"batch_(\d+)\.(.*)")
        for i in range(self.content.size()):
            key = self.content.key_at(i)
            match = pattern.match(key or "")
            if match is None:
                raise ValueError(f"Unexpected key in batch input: {key}")
            batch[int(match.group(1))].content.add(match.group(2), self.content.value_at(i))
        return batch

    def get_function_name(self) -> str | None:
        return self.function_name

    def get_properties(self) -> dict[str, Any]:
        return self.properties

    def get_content(self) -> PairList:
        return self.content

    def get_property(self, key: str) -> Any:
        """The property *key*, compared without case (``Content-Type`` = ``content-type``)."""
        return next((v for k, v in self.properties.items() if k.lower() == key.lower()), None)

    def contains_key(self, key: str) -> bool:
        return self.content.get(key) is not None

    def get_data(self, key: str | None = None) -> Any:
        """The body decoded by its content type: JSON, text, npz, an image, else bytes."""
        content_type = self.get_property("content-type")
        if content_type == "tensor/npz":
            return self.get_as_npz(key)
        if content_type is not None and content_type.startswith("application/json"):
            return self.get_as_json(key)
        if content_type is not None and content_type.startswith("text/"):
            return self.get_as_string(key)
        if content_type is not None and content_type.startswith("image/"):
            return self.get_as_image(key)
        if self.content.is_empty():
            return None
        return self.get_as_bytes(key=key)

    def get_as_bytes(self, key: str | None = None) -> Any:
        if self.content.is_empty():
            return None
        if key:
            value = self.content.get(key)
            if value is None:
                raise KeyError(f"requested data for key:{key} is not found!")
            return value
        value = self.content.get("data")
        return self.content.value_at(0) if value is None else value

    def get_as_string(self, key: str | None = None) -> str:
        return bytes(self.get_as_bytes(key=key)).decode("utf-8")

    def get_as_json(self, key: str | None = None) -> Any:
        return json.loads(bytes(self.get_as_bytes(key=key)).decode("utf-8"))

    def get_as_image(self, key: str | None = None) -> Any:
        from PIL import Image  # type: ignore[import-not-found]  # only when asked for

        return Image.open(io.BytesIO(self.get_as_bytes(key=key)))

    def get_as_npz(self, key: str | None = None) -> list[Any]:
        import numpy

        npz = numpy.load(io.BytesIO(self.get_as_bytes(key=key)))
        return [npz[name] for name in npz.files]

    def get_as_csv(self, key: str | None = None) -> list[dict[str, str]]:
        import csv

        return list(csv.DictReader(io.StringIO(self.get_as_string(key=key))))

    def is_empty(self) -> bool:
        return self.content.is_empty()


class _JSONEncoder(json.JSONEncoder):
    """numpy scalars and arrays, and datetimes, as DJL's encoder writes them."""

    def default(self, o: Any) -> Any:
        import datetime

        if isinstance(o, datetime.datetime):
            return str(o)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if isinstance(o, numpy.integer):
                return int(o)
            if isinstance(o, numpy.floating):
                return float(o)
            if isinstance(o, numpy.ndarray):
                return o.tolist()
        return super().default(o)


class Output:
    """The answer to one request: ``code`` (the HTTP status), ``properties`` (response headers;
    ``Content-Type`` among them) and ``content`` (the body under ``data``, or the first
    value). The setters return the ``Output``, so calls chain."""

    def __init__(self, code: int = 200, message: str = "OK") -> None:
        self.code = code
        self.message = message
        self.properties: dict[str, Any] = {}
        self.content = PairList()

    def __str__(self) -> str:
        content = {str(self.content.key_at(i)): f"type: {type(self.content.value_at(i))}"
                   for i in range(self.content.size())}
        return json.dumps({"code": self.code, "message": self.message,
                           "properties": self.properties, "content": content}, indent=2)

    def set_code(self, code: int) -> Output:
        self.code = code
        return self

    def set_message(self, message: str) -> Output:
        self.message = message
        return self

    def error(self, error: str, code: int = 424, message: str = "prediction failure") -> Output:
        """A failed prediction: *code* with ``{"code", "message", "error"}`` as JSON."""
        self.code = code
        self.message = message
        self.add_property("content-type", "application/json")
        self.add_as_json({"code": code, "message": message, "error": error})
        return self

    def add_property(self, key: str, val: Any) -> Output:
        self.properties[key] = val
        return self

    def add(self, value: Any, key: str | None = None, batch_index: int | None = None) -> Output:
        """Text is UTF-8 encoded, bytes kept, anything else written as JSON."""
        if key is not None and not isinstance(key, str):
            key = str(key)
        if batch_index is not None:
            key = f"batch_{batch_index}.{key or 'data'}"
        if isinstance(value, str):
            self.content.add(key=key, value=value.encode("utf-8"))
        elif isinstance(value, bytes | bytearray):
            self.content.add(key=key, value=bytearray(value))
        else:
            self.add_as_json(value, key=key)
        return self

    def add_as_json(self, val: Any, key: str | None = None,
                    batch_index: int | None = None) -> Output:
        if batch_index is not None:
            key = f"batch_{batch_index}.{key or 'data'}"
        body = json.dumps(val, ensure_ascii=False, allow_nan=False, indent=2, cls=_JSONEncoder,
                          separators=(",", ":")).encode("utf-8")
        self.content.add(key=key, value=body)
        return self

    def add_as_npz(self, np_list: list[Any], key: str | None = None) -> Output:
        import numpy

        buffer = io.BytesIO()
        numpy.savez(buffer, *np_list)
        self.content.add(key=key, value=buffer.getvalue())
        return self


def djl_module() -> ModuleType:
    """The real ``djl_python`` when it is installed, else this module."""
    if "djl_python" in sys.modules:
        return sys.modules["djl_python"]
    if importlib.util.find_spec("djl_python") is not None:
        return importlib.import_module("djl_python")
    return sys.modules[__name__]


def register() -> bool:
    """Make ``import djl_python`` find this module, unless the real package is installed (or
    already imported); True when it did."""
    if "djl_python" in sys.modules or importlib.util.find_spec("djl_python") is not None:
        return False
    me = sys.modules[__name__]
    for name in _NAMES:
        sys.modules[name] = me
    return True


def unregister() -> None:
    """Undo ``register`` (leaves a real ``djl_python`` alone)."""
    me = sys.modules[__name__]
    for name in _NAMES:
        if sys.modules.get(name) is me:
            del sys.modules[name]
