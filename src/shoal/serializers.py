"""At SageMaker's path ``sagemaker.serializers``: turn Python data into an ``/invocations`` request body.

Each serializer has a ``CONTENT_TYPE`` (sent as the request's Content-Type) and
``serialize(data) -> bytes | str``. numpy is imported only by the calls that need it, and
nothing here unpickles or pickles: ``NumpySerializer`` refuses object arrays.

Example:
    >>> from shoal.serializers import CSVSerializer
    >>> CSVSerializer().serialize([[1, 2], [3, 4]])
    '1,2\\n3,4'
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from typing import Any

from shoal._internal.extras import needs_extra
from shoal.errors import InvalidArgumentError

__all__ = ["BaseSerializer", "CSVSerializer", "DataSerializer", "IdentitySerializer",
           "JSONLinesSerializer", "JSONSerializer", "LibSVMSerializer", "NumpySerializer",
           "SimpleBaseSerializer", "SparseMatrixSerializer", "StringSerializer",
           "TorchTensorSerializer"]


class BaseSerializer:
    """SageMaker's abstract serializer: ``CONTENT_TYPE`` and ``serialize(data)``."""

    @property
    def CONTENT_TYPE(self) -> str:  # noqa: N802 (SageMaker's name)
        raise NotImplementedError(f"{type(self).__name__} must define CONTENT_TYPE")

    def serialize(self, data: Any) -> bytes | str:
        raise NotImplementedError(f"{type(self).__name__} must implement serialize()")


class SimpleBaseSerializer(BaseSerializer):
    """SageMaker's name for a serializer with a settable content type (kept for ports that
    subclass it); ``serialize`` is the subclass's."""

    def __init__(self, content_type: str = "application/json") -> None:
        if not isinstance(content_type, str):
            raise InvalidArgumentError(f"content_type must be a string, got {content_type!r}",
                                       argument="content_type")
        self.content_type = content_type

    @property
    def CONTENT_TYPE(self) -> str:  # noqa: N802 (SageMaker's name)
        return self.content_type

    def serialize(self, data: Any) -> bytes | str:
        raise NotImplementedError(f"{type(self).__name__} must implement serialize()")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(content_type={self.content_type!r})"


def _is_ndarray(data: Any) -> bool:
    return type(data).__module__ == "numpy" and type(data).__name__ == "ndarray"


class JSONSerializer(SimpleBaseSerializer):
    """JSON text; numpy arrays (also as values of a dict) become lists."""

    def __init__(self, content_type: str = "application/json") -> None:
        super().__init__(content_type)

    def serialize(self, data: Any) -> str:
        if isinstance(data, dict):
            return json.dumps({k: v.tolist() if _is_ndarray(v) else v for k, v in data.items()})
        if hasattr(data, "read"):
            text: str = data.read()  # a file object's text, sent as it is
            return text
        if _is_ndarray(data):
            return json.dumps(data.tolist())
        try:
            return json.dumps(data)
        except TypeError as e:
            raise InvalidArgumentError(f"JSONSerializer cannot serialize {type(data).__name__}: "
                                       f"{e}", argument="data") from e


class CSVSerializer(SimpleBaseSerializer):
    """Comma-separated rows: a flat sequence is one row, a sequence of sequences many."""

    def __init__(self, content_type: str = "text/csv") -> None:
        super().__init__(content_type)

    def serialize(self, data: Any) -> str:
        if (given := _text_as_given(data)) is not None:
            return given
        if hasattr(data, "to_csv"):  # a pandas DataFrame
            csv_text: str = data.to_csv(header=False, index=False)
            return csv_text.rstrip("\n")
        if _is_ndarray(data) and data.ndim > 1:
            data = data.tolist()
        if _is_sequence(data) and len(data) and all(_is_sequence(row) for row in data):
            return "\n".join(self._row(row) for row in data)
        return self._row(data)

    @staticmethod
    def _row(data: Any) -> str:
        if isinstance(data, str):
            return data
        if _is_ndarray(data):
            data = data.flatten().tolist()
        if not hasattr(data, "__len__"):
            raise InvalidArgumentError(f"CSVSerializer cannot serialize {type(data).__name__}; "
                                       "give a list, a list of lists, an array or a string",
                                       argument="data")
        if len(data) == 0:
            raise InvalidArgumentError("CSVSerializer cannot serialize an empty row",
                                       argument="data")
        buffer = io.StringIO()
        csv.writer(buffer, delimiter=",").writerow(list(data))
        return buffer.getvalue().rstrip("\r\n")


def _is_sequence(data: Any) -> bool:
    return (isinstance(data, Iterable) and hasattr(data, "__len__")
            and not isinstance(data, str | bytes | dict))


class NumpySerializer(SimpleBaseSerializer):
    """A NumPy ``.npy`` file (``application/x-npy``), written without pickle."""

    def __init__(self, dtype: Any = None, content_type: str = "application/x-npy") -> None:
        super().__init__(content_type)
        self.dtype = dtype

    @needs_extra("serve", "NumpySerializer")
    def serialize(self, data: Any) -> bytes:
        import numpy as np

        if hasattr(data, "read"):
            body: bytes = data.read()  # a file object's .npy bytes, sent as they are
            return body
        if isinstance(data, np.ndarray):
            array = data if self.dtype is None else data.astype(self.dtype)
        else:
            if isinstance(data, list | tuple) and len(data) == 0:
                raise InvalidArgumentError("NumpySerializer cannot serialize an empty list",
                                           argument="data")
            array = np.array(data, dtype=self.dtype)
        if array.size == 0:
            raise InvalidArgumentError("NumpySerializer cannot serialize an empty array",
                                       argument="data")
        if array.dtype.hasobject:
            raise InvalidArgumentError(
                "NumpySerializer writes .npy without pickle, so it cannot send an object array "
                f"(dtype {array.dtype}); give numbers of one type (e.g. a float32 array)",
                argument="data")
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return buffer.getvalue()


class IdentitySerializer(SimpleBaseSerializer):
    """The data as given (bytes or str), with the content type you name."""

    def __init__(self, content_type: str = "application/octet-stream") -> None:
        super().__init__(content_type)

    def serialize(self, data: Any) -> Any:  # SageMaker's: whatever is given goes as the body
        return data


class JSONLinesSerializer(SimpleBaseSerializer):
    """One JSON document per line (``application/jsonlines``) from a list of objects."""

    def __init__(self, content_type: str = "application/jsonlines") -> None:
        super().__init__(content_type)

    def serialize(self, data: Any) -> str:
        if (given := _text_as_given(data)) is not None:
            return given
        if not _is_sequence(data):
            raise InvalidArgumentError("JSONLinesSerializer takes a list of JSON-serializable "
                                       f"objects, got {type(data).__name__}", argument="data")
        return "\n".join(json.dumps(item) for item in data)


class StringSerializer(SimpleBaseSerializer):
    """Text as given (``text/plain`` by default); other objects through ``str()``."""

    def __init__(self, content_type: str = "text/plain") -> None:
        super().__init__(content_type)

    def serialize(self, data: Any) -> str:
        return data if isinstance(data, str) else str(data)


class DataSerializer(SimpleBaseSerializer):
    """Raw bytes, or the contents of the file whose path is given (audio, images...)."""

    def __init__(self, content_type: str = "file-path/raw-bytes") -> None:
        super().__init__(content_type)

    def serialize(self, data: Any) -> bytes:
        if isinstance(data, bytes | bytearray):
            return bytes(data)
        if isinstance(data, str):
            from pathlib import Path

            path = Path(data)
            if not path.is_file():
                raise InvalidArgumentError(f"DataSerializer: {data} is not a file",
                                           argument="data", path=data)
            return path.read_bytes()
        raise InvalidArgumentError(f"DataSerializer takes bytes or a file path, got "
                                   f"{type(data).__name__}", argument="data")


class LibSVMSerializer(SimpleBaseSerializer):
    """LibSVM text (``text/libsvm``): a string as given (SageMaker also takes a file-like)."""

    def __init__(self, content_type: str = "text/libsvm") -> None:
        super().__init__(content_type)

    def serialize(self, data: Any) -> str:
        if (given := _text_as_given(data)) is not None:
            return given
        raise InvalidArgumentError(f"LibSVMSerializer takes LibSVM text, got "
                                   f"{type(data).__name__}", argument="data")


class SparseMatrixSerializer(SimpleBaseSerializer):
    """A scipy sparse matrix as ``.npz`` (``application/x-npz``)."""

    def __init__(self, content_type: str = "application/x-npz") -> None:
        super().__init__(content_type)

    @needs_extra("sklearn", "SparseMatrixSerializer")
    def serialize(self, data: Any) -> bytes:
        import scipy.sparse

        if not scipy.sparse.issparse(data):
            raise InvalidArgumentError(f"SparseMatrixSerializer takes a scipy.sparse matrix, "
                                       f"got {type(data).__name__}", argument="data")
        buffer = io.BytesIO()
        # issparse() narrows to every sparse type; save_npz's stub takes the ones it can
        # write, and save_npz itself refuses the others (dok, lil) with its own message.
        scipy.sparse.save_npz(buffer, data)  # type: ignore[arg-type]
        return buffer.getvalue()


class TorchTensorSerializer(SimpleBaseSerializer):
    """A torch tensor as ``.npy`` (``tensor/pt``), through numpy and without pickle."""

    def __init__(self, content_type: str = "tensor/pt") -> None:
        super().__init__(content_type)
        self._numpy = NumpySerializer(content_type=content_type)

    def serialize(self, data: Any) -> bytes:
        if not hasattr(data, "detach"):
            raise InvalidArgumentError(f"TorchTensorSerializer takes a torch.Tensor, got "
                                       f"{type(data).__name__}", argument="data")
        return self._numpy.serialize(data.detach().cpu().numpy())


def _text_as_given(data: Any) -> str | None:
    """Text already in the wire format passes as it is: a str, or what a file object reads."""
    if isinstance(data, str):
        return data
    if hasattr(data, "read"):
        text: str = data.read()
        return text
    return None
