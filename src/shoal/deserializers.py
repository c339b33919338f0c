"""At SageMaker's path ``sagemaker.deserializers``: turn an ``/invocations`` response body into Python data.

Each deserializer has ``ACCEPT`` (a tuple of media types, sent as the request's Accept) and
``deserialize(stream, content_type)``, where *stream* has ``read()`` (and ``close()``).
``NumpyDeserializer`` never unpickles unless asked to with ``allow_pickle=True``.

Example:
    >>> import io
    >>> from shoal.deserializers import CSVDeserializer
    >>> CSVDeserializer().deserialize(io.BytesIO(b"1,2\\n3,4"), "text/csv")
    [['1', '2'], ['3', '4']]
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from typing import Any

from shoal._internal.extras import needs_extra
from shoal.errors import InvalidArgumentError

__all__ = ["BaseDeserializer", "BytesDeserializer", "CSVDeserializer", "JSONDeserializer",
           "JSONLinesDeserializer", "NumpyDeserializer", "PandasDeserializer",
           "SimpleBaseDeserializer", "StreamDeserializer", "StringDeserializer",
           "TorchTensorDeserializer"]


class BaseDeserializer:
    """SageMaker's abstract deserializer: ``ACCEPT`` and ``deserialize(stream, content_type)``."""

    @property
    def ACCEPT(self) -> tuple[str, ...]:  # noqa: N802 (SageMaker's name)
        raise NotImplementedError(f"{type(self).__name__} must define ACCEPT")

    def deserialize(self, stream: Any, content_type: str) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement deserialize()")


class SimpleBaseDeserializer(BaseDeserializer):
    """SageMaker's name for a deserializer with a settable Accept (kept for ports that subclass
    it); ``deserialize`` is the subclass's."""

    def __init__(self, accept: str | tuple[str, ...] = "*/*") -> None:
        self.accept = accept

    @property
    def ACCEPT(self) -> tuple[str, ...]:  # noqa: N802 (SageMaker's name)
        return (self.accept,) if isinstance(self.accept, str) else tuple(self.accept)

    def deserialize(self, stream: Any, content_type: str) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement deserialize()")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(accept={self.accept!r})"


def _read(stream: Any) -> bytes:
    try:
        data = stream.read()
    finally:
        with contextlib.suppress(Exception):
            stream.close()
    return data.encode() if isinstance(data, str) else bytes(data)


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


class BytesDeserializer(SimpleBaseDeserializer):
    """The body as bytes."""

    def deserialize(self, stream: Any, content_type: str) -> bytes:
        return _read(stream)


class StringDeserializer(SimpleBaseDeserializer):
    """The body as text in *encoding*."""

    def __init__(self, encoding: str = "UTF-8", accept: str | tuple[str, ...] = "application/json"
                 ) -> None:
        super().__init__(accept)
        self.encoding = encoding

    def deserialize(self, stream: Any, content_type: str) -> str:
        return _read(stream).decode(self.encoding)


class JSONDeserializer(SimpleBaseDeserializer):
    """The body parsed as JSON."""

    def __init__(self, accept: str | tuple[str, ...] = "application/json") -> None:
        super().__init__(accept)

    def deserialize(self, stream: Any, content_type: str) -> Any:
        data = _read(stream)
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError as e:
            raise InvalidArgumentError(f"the response ({_media_type(content_type) or 'no '}"
                                       f"content type) is not JSON: {e}; first bytes "
                                       f"{data[:80]!r}", content_type=content_type) from e


class CSVDeserializer(SimpleBaseDeserializer):
    """The body as a list of rows, each a list of strings."""

    def __init__(self, encoding: str = "utf-8", accept: str | tuple[str, ...] = "text/csv"
                 ) -> None:
        super().__init__(accept)
        self.encoding = encoding

    def deserialize(self, stream: Any, content_type: str) -> list[list[str]]:
        return list(csv.reader(_read(stream).decode(self.encoding).splitlines()))


class NumpyDeserializer(SimpleBaseDeserializer):
    """An array from ``.npy`` (without pickle), JSON or CSV, by the response's content type."""

    def __init__(self, dtype: Any = None, accept: str | tuple[str, ...] = "application/x-npy",
                 allow_pickle: bool = False) -> None:
        super().__init__(accept)
        self.dtype = dtype
        self.allow_pickle = allow_pickle

    @needs_extra("serve", "NumpyDeserializer")
    def deserialize(self, stream: Any, content_type: str) -> Any:
        import numpy as np

        media = _media_type(content_type)
        data = _read(stream)
        if media == "application/x-npy":
            try:
                array = np.load(io.BytesIO(data), allow_pickle=self.allow_pickle)
            except ValueError as e:  # an object array without allow_pickle, or not .npy
                raise InvalidArgumentError(f"NumpyDeserializer cannot read the response as .npy "
                                           f"without pickle: {e}", content_type=content_type
                                           ) from e
            return array if self.dtype is None else array.astype(self.dtype)
        if media == "application/json":
            return np.array(json.loads(data.decode("utf-8")), dtype=self.dtype)
        if media == "text/csv":
            rows = list(csv.reader(data.decode("utf-8").splitlines()))
            return np.array(rows, dtype=self.dtype if self.dtype is not None else float)
        raise InvalidArgumentError(f"NumpyDeserializer cannot read content type "
                                   f"{content_type!r}; it reads application/x-npy, "
                                   "application/json and text/csv", content_type=content_type)


class StreamDeserializer(SimpleBaseDeserializer):
    """The response's stream and content type, unread: ``(stream, content_type)``."""

    def deserialize(self, stream: Any, content_type: str) -> tuple[Any, str]:
        return stream, content_type


class JSONLinesDeserializer(SimpleBaseDeserializer):
    """A JSON Lines body as a list, one item per line."""

    def __init__(self, accept: str | tuple[str, ...] = "application/jsonlines") -> None:
        super().__init__(accept)

    def deserialize(self, stream: Any, content_type: str) -> list[Any]:
        text = _read(stream).decode("utf-8")
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise InvalidArgumentError(f"the response is not JSON Lines: {e}",
                                       content_type=content_type) from e


class PandasDeserializer(SimpleBaseDeserializer):
    """A CSV or JSON body as a pandas DataFrame."""

    def __init__(self, accept: str | tuple[str, ...] = ("text/csv", "application/json")
                 ) -> None:
        super().__init__(accept)

    @needs_extra("experiments", "PandasDeserializer")
    def deserialize(self, stream: Any, content_type: str) -> Any:
        import pandas as pd

        media = _media_type(content_type)
        data = _read(stream)
        if media == "text/csv":
            return pd.read_csv(io.BytesIO(data))
        if media == "application/json":
            return pd.read_json(io.BytesIO(data))
        raise InvalidArgumentError(f"PandasDeserializer cannot read content type "
                                   f"{content_type!r}; it reads text/csv and application/json",
                                   content_type=content_type)


class TorchTensorDeserializer(SimpleBaseDeserializer):
    """A ``.npy`` (or JSON) body as a torch tensor, without pickle."""

    def __init__(self, accept: str | tuple[str, ...] = "tensor/pt") -> None:
        super().__init__(accept)

    @needs_extra("torch", "TorchTensorDeserializer")
    def deserialize(self, stream: Any, content_type: str) -> Any:
        import torch

        media = _media_type(content_type)
        as_numpy = "application/json" if media == "application/json" else "application/x-npy"
        return torch.from_numpy(NumpyDeserializer().deserialize(stream, as_numpy))
