"""Versioned, HMAC-signed cloudpickle envelopes: bytes in, bytes out, no I/O.

A payload travels as two blobs: ``payload.pkl`` (the pickle) and ``metadata.json``
(format version, Python version, serializer, HMAC-SHA256 of the pickle under the job's key),
stored as two files or, when small, as one row of the metadata store (``jobs/_payloads.py``).
A payload whose HMAC does not verify is never unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
import sys
from dataclasses import dataclass
from typing import Any

# A private copy of the json codec, made at import: a job's code may replace json.JSONEncoder,
# json.dumps or their methods, and must not corrupt the envelopes written after it returns.
from shoal._internal.jsoncodec import dumps as _json_dumps
from shoal._internal.jsoncodec import loads as _json_loads
from shoal.errors import (
    PayloadIntegrityError,
    PayloadVersionError,
    PicklingError,
    SerializationError,
)

__all__ = ["FORMAT_VERSION", "Payload", "deserialize", "new_key", "python_version", "resign",
           "serialize"]

FORMAT_VERSION = 1
SERIALIZER = "cloudpickle"


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def new_key() -> str:
    import secrets

    return secrets.token_hex(32)


@dataclass(frozen=True, slots=True)
class Payload:
    data: bytes
    metadata: bytes

    @property
    def meta(self) -> dict[str, Any]:
        metadata: dict[str, Any] = _json_loads(self.metadata)
        return metadata


def _sign(key: str, data: bytes) -> str:
    return hmac.new(bytes.fromhex(key), data, hashlib.sha256).hexdigest()


def serialize(obj: object, key: str, *, what: str,
              by_value: tuple[str, ...] = ()) -> Payload:
    """Pickle *obj* and sign it. *what* names the object in errors ("function 'divide'").

    *by_value* names modules whose functions and classes travel by value rather than as an
    import, for a job whose environment cannot import them (a local, uninstalled module).
    """
    import cloudpickle

    registered = []
    for name in by_value:
        module = sys.modules.get(name)
        if module is not None and name not in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.register_pickle_by_value(module)
            registered.append(module)
    try:
        data = _dumps(obj)
    except Exception as e:  # cloudpickle raises many types: TypeError, PicklingError, ...
        culprit = _find_unpicklable(obj)
        where = f" ({culprit})" if culprit else ""
        raise PicklingError(
            f"cannot pickle the {what}{where}: {type(e).__name__}: {e}. Objects such as locks, "
            "open files, sockets and database connections cannot be sent to a job; create them "
            "inside the function instead.", what=what, culprit=culprit,
        ) from e
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)
    meta = {
        "format_version": FORMAT_VERSION,
        "serializer": SERIALIZER,
        "python_version": python_version(),
        "cloudpickle_version": getattr(cloudpickle, "__version__", "?"),
        "size": len(data),
        "hmac_sha256": _sign(key, data),
    }
    return Payload(data, _json_dumps(meta, sort_keys=True).encode())


def resign(payload: Payload, key: str) -> Payload:
    """The same pickle signed under another key: one function pickled once for many jobs,
    each of which verifies it under its own key."""
    meta = payload.meta
    meta["hmac_sha256"] = _sign(key, payload.data)
    return Payload(payload.data, _json_dumps(meta, sort_keys=True).encode())


_PICKLER: type[pickle.Pickler] | None = None


def _pickler_class() -> type[pickle.Pickler]:
    """cloudpickle's Pickler, keeping each code object's file name.

    cloudpickle replaces ``co_filename`` with ``<dynamic-code>`` for deterministic payloads;
    we keep it, so a remote traceback shows the user's own source lines.
    """
    global _PICKLER
    if _PICKLER is None:
        import types
        from collections import ChainMap

        import cloudpickle
        from cloudpickle import cloudpickle as impl

        reduce_code = getattr(impl, "_code_reduce", None)
        if reduce_code is None:  # pragma: no cover - a cloudpickle without that hook
            _PICKLER = cloudpickle.Pickler
            return _PICKLER

        def keep_filename(code: types.CodeType) -> tuple[object, tuple[object, ...]]:
            fn, args = reduce_code(code)
            args = tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)
            return fn, args

        # cloudpickle ships no type information: its Pickler is Any to mypy.
        class ShoalPickler(cloudpickle.Pickler):  # type: ignore[misc]
            dispatch_table = ChainMap({types.CodeType: keep_filename},
                                      cloudpickle.Pickler.dispatch_table)

        _PICKLER = ShoalPickler
    return _PICKLER


def warm_up() -> None:
    """Pay cloudpickle's first-use costs now (a fork server does, so its children need not)."""
    key = new_key()
    deserialize(serialize(lambda x: x, key, what="warm-up"), key, what="warm-up")


def _dumps(obj: object) -> bytes:
    import io

    buf = io.BytesIO()
    _pickler_class()(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def deserialize(payload: Payload, key: str, *, what: str, reader: str = "job") -> Any:
    """Verify and unpickle. Raises before unpickling if anything is off. *reader* is who
    unpickles: ``"job"`` (a function and its arguments) or ``"client"`` (a result, an
    exception), so that a module that cannot be imported is blamed on the right side."""
    try:
        meta = payload.meta
        if not isinstance(meta, dict):
            raise TypeError(f"a JSON {type(meta).__name__}, not an object")
    except (ValueError, TypeError) as e:
        # Unreadable is not tampered with: the HMAC (below) is what says a payload changed.
        raise SerializationError(
            f"the metadata (metadata.json) of the {what} is unreadable, not a JSON object "
            f"({type(e).__name__}: {e}): it was cut short or damaged where it is stored, so the "
            f"payload was not unpickled. Run the job again; if it recurs, check the artifact "
            f"store's disk", what=what, unreadable=True) from e
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise PayloadVersionError(
            f"the {what} uses payload format {version!r}; this shoal reads format "
            f"{FORMAT_VERSION}. Use the same shoal version on both sides.", what=what,
        )
    if meta.get("serializer") != SERIALIZER:
        raise PayloadVersionError(f"the {what} was written by serializer "
                                  f"{meta.get('serializer')!r}, expected {SERIALIZER!r}", what=what)
    theirs, ours = meta.get("python_version"), python_version()
    if theirs != ours:
        raise PayloadVersionError(
            f"the {what} was pickled on Python {theirs} but this process runs Python {ours}; "
            "client and job must use the same Python major.minor.", what=what,
            client_python=theirs, job_python=ours,
        )
    expected = meta.get("hmac_sha256", "")
    if not isinstance(expected, str) or not hmac.compare_digest(_sign(key, payload.data), expected):
        raise PayloadIntegrityError(
            f"the {what} failed its HMAC-SHA256 check: it was changed after it was written, or "
            "signed with another job's key. It was not unpickled.", what=what,
        )
    import cloudpickle

    try:
        return cloudpickle.loads(payload.data)
    except Exception as e:
        missing = getattr(e, "name", None) if isinstance(e, ImportError) else None
        hint = (_client_hint(payload.data, missing, e) if reader == "client"
                else f" Module {missing!r} is not importable in the job's environment: add it "
                     "to dependencies, or ship it with include_local_workdir=True."
                if missing else "")
        raise SerializationError(f"cannot unpickle the {what}: {type(e).__name__}: {e}.{hint}",
                                 what=what, module=missing, reader=reader) from e


def _client_hint(data: bytes, missing: str | None, error: Exception) -> str:
    """Why this client cannot unpickle what a job sent back, and what to do."""
    needed = _globals_in(data)
    if missing:
        names = [f"{m}.{n}" for m, n in needed if m == missing or m.startswith(missing + ".")]
        what = f"module {missing!r}" + (f" (for {', '.join(names[:3])})" if names else "")
    elif isinstance(error, AttributeError) and needed:
        module = next((m for m, n in needed if f"'{n.split('.')[0]}'" in str(error)), None)
        what = (f"{module}.{next(n for m, n in needed if m == module)}" if module
                else "a class or function the job returned")
    else:
        return ""
    return (f" This client (the process reading the result, not the job) cannot import {what},"
            " which the job's code used for what it returned. Install or import it in the "
            "client's environment (the module the job imported, at the same version), or have "
            "the job return plain types (dict, list, str, numbers, numpy arrays).")


def _globals_in(data: bytes) -> list[tuple[str, str]]:
    """The (module, name) pairs a pickle imports, in order (best effort: [] if unreadable)."""
    import pickletools

    found: list[tuple[str, str]] = []
    strings: list[object] = []
    memo: dict[int, object] = {}
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
                strings.append(arg)
            elif op.name == "MEMOIZE" and strings:
                memo[len(memo)] = strings[-1]
            elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                strings.append(memo.get(arg) if isinstance(arg, int) else None)
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append((str(strings[-2]), str(strings[-1])))
            elif op.name == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                found.append((module, name))
            elif op.name not in ("FRAME", "PROTO"):
                strings.append(None)  # anything else on the stack breaks a (module, name) pair
    except Exception:  # noqa: BLE001 - a truncated or odd pickle: no names, no hint
        return found
    return found


def _find_unpicklable(obj: object) -> str | None:
    """Name the part of *obj* that does not pickle: a closure cell, a global or an argument."""
    def bad(x: object) -> bool:
        try:
            _dumps(x)
        except Exception:
            return True
        return False

    parts: list[tuple[str, object]] = []
    code = getattr(obj, "__code__", None)
    if code is not None:
        cells = getattr(obj, "__closure__", None) or ()
        parts += [(f"closure variable {n!r}", c.cell_contents)
                  for n, c in zip(code.co_freevars, cells, strict=False) if _cell_ok(c)]
        glb = getattr(obj, "__globals__", {})
        parts += [(f"global {n!r}", glb[n]) for n in code.co_names if n in glb]
    elif isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], dict):
        args, kwargs = obj
        parts += [(f"argument {i}", a) for i, a in enumerate(args)]
        parts += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in parts:
        if bad(value):
            return f"{label} of type {type(value).__module__}.{type(value).__qualname__}"
    return None


def _cell_ok(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises ValueError
    except ValueError:
        return False
    return True
