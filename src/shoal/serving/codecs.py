"""Request and response bodies: ``application/json``, ``text/csv`` and ``application/x-npy``
(never with pickle), and ``Accept`` negotiation.

numpy is imported on first use, so the server's module graph stays light until a model loads.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterable
from typing import Any

from shoal.serving.http import RequestError, bad_request

__all__ = ["CSV", "JSON", "NPY", "SUPPORTED", "decode", "decode_json_document", "encode",
           "media_type", "negotiate"]

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
SUPPORTED = (JSON, CSV, NPY)


def media_type(header: str | None) -> str:
    """``"application/json; charset=utf-8"`` → ``"application/json"``; none → JSON."""
    if not header:
        return JSON
    return header.split(";", 1)[0].strip().lower() or JSON


def unsupported(content_type: str, supported: Iterable[str]) -> RequestError:
    return RequestError(415, "unsupported media type",
                        f"Content-Type {content_type!r} is not accepted; send one of "
                        f"{', '.join(supported)}")


def negotiate(accept: str | None, request_type: str, supported: Iterable[str] | None) -> str:
    """The response type for *accept*: the request's own type when acceptable, else JSON.

    Raises ``RequestError`` 406 when nothing in *accept* is in *supported*. With *supported*
    None (a user's output_fn decides) the most preferred concrete type is passed on.
    """
    if supported is None:
        return _preferred(accept) or request_type
    supported = tuple(supported)
    default = request_type if request_type in supported else JSON
    if not accept or accept.strip() in ("*/*", ""):
        return default
    for kind in _ranges(accept):
        if kind == "*/*":
            return default
        if kind.endswith("/*"):
            family = kind[:-1]
            matches = [t for t in (default, *supported) if t.startswith(family)]
            if matches:
                return matches[0]
        elif kind in supported:
            return kind
    raise RequestError(406, "not acceptable",
                       f"Accept {accept!r} asks for nothing this model answers with; accept one "
                       f"of {', '.join(supported)}")


def _ranges(accept: str) -> list[str]:
    """Media ranges of an Accept header, most preferred first (q=0 dropped)."""
    ranges = []
    for n, part in enumerate(accept.split(",")):
        kind, _, params = part.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if kind.strip() and q > 0:
            ranges.append((-q, n, kind.strip().lower()))
    return [kind for _, _, kind in sorted(ranges)]


def _preferred(accept: str | None) -> str | None:
    for kind in _ranges(accept or ""):
        if "*" not in kind:
            return kind
    return None


# --- decoding ------------------------------------------------------------------------------

def decode(body: bytes, content_type: str, *, dtype: Any = None, writable: bool = True) -> Any:
    """Bytes → a numpy array (or, for a JSON object of arrays, a dict of them).

    ``writable=False`` lets an x-npy array share the body's memory (read-only) instead of
    being copied."""
    if content_type == NPY:
        return load_npy(body, writable=writable)
    if content_type == JSON:
        return _decode_json(body, dtype)
    if content_type == CSV:
        return _decode_csv(body, dtype)
    raise unsupported(content_type, SUPPORTED)


#: orjson's nesting limit (arrays and objects within each other)
_ORJSON_MAX_DEPTH = 1024


def decode_json_document(body: bytes, *, invalid: str = "the body is not valid JSON") -> Any:
    """The JSON document in *body*; 400 (``"{invalid}: why"``) when it does not parse, is
    nested deeper than the parser goes, or holds an integer longer than Python converts."""
    orjson = _orjson()
    if orjson is not None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            if str(e).startswith("depth limit exceeded"):
                raise _too_deep(invalid, f"{_ORJSON_MAX_DEPTH}") from None
            # else NaN/Infinity literals, which json accepts, or an error json will describe
    try:
        return json.loads(body)
    except RecursionError:
        raise _too_deep(invalid, f"about {sys.getrecursionlimit()}") from None
    except (UnicodeDecodeError, ValueError) as e:
        if "integer string conversion" in str(e):
            raise bad_request(f"{invalid}: it holds an integer with more than "
                              f"{sys.get_int_max_str_digits()} digits, the most Python converts; "
                              f"send such a number as a string") from None
        raise bad_request(f"{invalid}: {e}") from None


def _too_deep(invalid: str, limit: str) -> RequestError:
    return bad_request(f"{invalid}: it is nested more than {limit} levels deep (arrays or "
                       f"objects within each other), deeper than the server parses")


_ORJSON: Any = None


def _orjson() -> Any:
    """orjson when installed (the ``serve`` extra): 5-7x faster on arrays of numbers."""
    global _ORJSON
    if _ORJSON is None:
        try:
            import orjson as module
        except ImportError:
            _ORJSON = False
        else:
            _ORJSON = module
    return _ORJSON or None


def _decode_json(body: bytes, dtype: Any) -> Any:
    doc = decode_json_document(body)
    if isinstance(doc, dict):
        for key in ("instances", "inputs"):
            if key in doc and len(doc) == 1:
                return _array(doc[key], dtype, where=f'"{key}"')
        return {name: _array(value, dtype, where=f'"{name}"') for name, value in doc.items()}
    return _array(doc, dtype, where="the body")


def _array(value: Any, dtype: Any, *, where: str) -> Any:
    import numpy as np

    try:
        arr = np.asarray(value, dtype=dtype)
    except (ValueError, TypeError) as e:
        raise bad_request(f"{where} is not a rectangular array of numbers: {e}") from None
    if arr.dtype == object:
        raise bad_request(f"{where} is not a rectangular array of numbers")
    return arr


def _decode_csv(body: bytes, dtype: Any) -> Any:
    import numpy as np

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"text/csv bodies must be UTF-8: {e}") from None
    if not text.strip():
        raise bad_request("the text/csv body is empty")
    try:
        return np.loadtxt(io.StringIO(text), delimiter=",", ndmin=2,
                          dtype=dtype or np.float64)
    except ValueError as e:
        raise bad_request(f"the text/csv body is not rows of numbers: {e}") from None


# Header bytes → (dtype, shape, fortran_order) of bodies np.load has already accepted, so a
# client sending the same shape again skips the header's literal_eval (most of np.load's cost).
_NPY_HEADERS: dict[bytes, tuple[Any, tuple[int, ...], bool]] = {}
_NPY_CACHE_MAX = 256


def load_npy(body: bytes, *, writable: bool = True) -> Any:
    """``np.load(..., allow_pickle=False)``: object arrays and pickles are refused with 400."""
    import numpy as np

    if body[:6] == b"\x93NUMPY" and len(body) >= 12:
        size_bytes = 2 if body[6] == 1 else 4
        start = 8 + size_bytes
        end = start + int.from_bytes(body[8:start], "little")
        meta = _NPY_HEADERS.get(body[:end])
        if meta is not None:
            dtype, shape, fortran = meta
            count = 1
            for n in shape:
                count *= n
            try:
                flat = np.frombuffer(body, dtype=dtype, count=count, offset=end)
            except ValueError as e:
                raise bad_request(f"the application/x-npy body is truncated: {e}") from None
            arr = flat.reshape(shape, order="F" if fortran else "C")
            return arr.copy() if writable else arr
    try:
        arr = np.load(io.BytesIO(body), allow_pickle=False)
    except ValueError as e:
        # numpy says "Object arrays cannot be loaded when allow_pickle=False" or "Cannot load
        # file containing pickled data...": both are what we refuse.
        raise bad_request(f"the application/x-npy body was refused (pickled objects are never "
                          f"loaded): {e}") from None
    except (OSError, EOFError) as e:
        raise bad_request(f"the application/x-npy body is not a .npy array: {e}") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        raise bad_request("application/x-npy bodies hold one .npy array, not an .npz archive")
    if len(_NPY_HEADERS) < _NPY_CACHE_MAX and body[:6] == b"\x93NUMPY":
        size_bytes = 2 if body[6] == 1 else 4
        end = 8 + size_bytes + int.from_bytes(body[8:8 + size_bytes], "little")
        fortran = arr.flags.f_contiguous and not arr.flags.c_contiguous
        _NPY_HEADERS[body[:end]] = (arr.dtype, arr.shape, fortran)
    return arr


# --- encoding ------------------------------------------------------------------------------

def encode(value: Any, accept: str) -> bytes:
    """A prediction (array, dict of arrays, list, scalar) → bytes of type *accept*."""
    if accept == JSON:
        orjson = _orjson()
        if orjson is not None:
            try:
                out: bytes = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
                return out
            except TypeError:
                pass  # numpy strings, non-contiguous arrays, objects: the general path below
        return json.dumps(_jsonable(value), separators=(",", ":")).encode()
    if accept == CSV:
        return _encode_csv(value)
    if accept == NPY:
        return dump_npy(value)
    raise RequestError(406, "not acceptable", f"cannot answer with {accept!r}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _single_array(value: Any, media: str) -> Any:
    import numpy as np

    if isinstance(value, dict):
        if len(value) != 1:
            raise RequestError(406, "not acceptable",
                               f"the model answers with {len(value)} outputs "
                               f"({', '.join(map(str, value))}); {media} holds one array; "
                               f"accept application/json instead")
        value = next(iter(value.values()))
    return np.asarray(value)


def _encode_csv(value: Any) -> bytes:
    arr = _single_array(value, CSV)
    if arr.ndim > 2:
        arr = arr.reshape(arr.shape[0], -1)
    rows = arr.reshape(-1, 1).tolist() if arr.ndim < 2 else arr.tolist()
    return ("\n".join(",".join(str(v) for v in row) for row in rows) + "\n").encode()


_NPY_OUT_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def dump_npy(value: Any) -> bytes:
    import numpy as np

    arr = np.ascontiguousarray(_single_array(value, NPY))
    if arr.dtype.hasobject:
        raise RequestError(406, "not acceptable", "the prediction holds Python objects, which "
                           "application/x-npy cannot carry without pickle; accept "
                           "application/json instead")
    key = (arr.dtype.str, arr.shape)
    header = _NPY_OUT_HEADERS.get(key)
    if header is None:
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        data = buf.getvalue()
        if len(_NPY_OUT_HEADERS) < _NPY_CACHE_MAX:
            _NPY_OUT_HEADERS[key] = data[:len(data) - arr.nbytes]
        return data
    return header + arr.tobytes()
