"""Inside the job: load the signed function and arguments, call, write the signed result.

Runs as ``python -m shoal.jobs._entrypoint WORKDIR`` in the job's own interpreter (or forked),
so it imports only the standard library, cloudpickle and ``shoal.serialization``. It talks to
the supervisor through flat files in WORKDIR (``function.pkl``/``.json``, ``arguments.*``,
``results.*``, ``exception.*``); the supervisor alone touches the stores.
Exit codes: 0 result written, 1 the function raised (exception written), 3 a payload was
refused (``shoal_error.json`` says why).
"""

from __future__ import annotations

import os
import sys
import traceback

# Bound at import: user code may monkeypatch json, and must not corrupt our envelopes.
from json import dumps as _json_dumps
from pathlib import Path

from shoal.errors import PayloadIntegrityError, PayloadVersionError, SerializationError
from shoal.serialization import Payload, deserialize, serialize

__all__ = ["main"]

EXIT_OK, EXIT_RAISED, EXIT_REFUSED = 0, 1, 3


def _read(workdir: Path, name: str) -> Payload:
    return Payload((workdir / f"{name}.pkl").read_bytes(),
                   (workdir / f"{name}.json").read_bytes())


def _write(workdir: Path, name: str, payload: Payload) -> None:
    # The pickle first, its metadata last: whoever finds the metadata finds the whole payload.
    for fname, data in ((f"{name}.pkl", payload.data), (f"{name}.json", payload.metadata)):
        tmp = workdir / f".{fname}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, workdir / fname)


def _refuse(workdir: Path, kind: str, message: str) -> int:
    (workdir / "shoal_error.json").write_text(_json_dumps({"kind": kind, "message": message}))
    sys.stderr.write(f"shoal: {message}\n")
    return EXIT_REFUSED


def run(workdir: Path, key: str) -> int:
    try:
        func = deserialize(_read(workdir, "function"), key, what="function payload")
        args, kwargs = deserialize(_read(workdir, "arguments"), key, what="arguments payload")
    except PayloadIntegrityError as e:
        return _refuse(workdir, "integrity", str(e))
    except PayloadVersionError as e:
        return _refuse(workdir, "version", str(e))
    except SerializationError as e:
        return _refuse(workdir, "user_error", str(e))
    try:
        result = func(*args, **kwargs)
    except BaseException as e:  # the user's exception, SystemExit and KeyboardInterrupt too
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        _write_exception(workdir, e, tb, key)
        return EXIT_RAISED
    try:
        payload = serialize(result, key, what=f"result of type {type(result).__qualname__}")
    except SerializationError as e:
        tb = traceback.format_exc()
        sys.stderr.write(f"shoal: {e}\n")
        _write_exception(workdir, e, tb, key)
        return EXIT_RAISED
    _write(workdir, "results", payload)
    return EXIT_OK


def _write_exception(workdir: Path, exc: BaseException, tb: str, key: str) -> None:
    _write(workdir, "exception", _exception_payload(exc, tb, key))
    summary = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
               "message": str(exc)[:2000]}
    (workdir / "exception.summary.json").write_text(_json_dumps(summary))


def _exception_payload(exc: BaseException, tb: str, key: str) -> Payload:
    info = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc),
            "traceback": tb}
    try:
        return serialize({**info, "exception": exc}, key, what="exception")
    except SerializationError:
        return serialize({**info, "exception": None}, key, what="exception")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    workdir = Path(args[0])
    # The key reaches the job through its environment; user code never sees it.
    key = os.environ.pop("SHOAL_JOB_KEY", "")
    os.chdir(os.environ.get("SHOAL_JOB_CWD") or workdir)
    return run(workdir, key)


if __name__ == "__main__":
    sys.exit(main())
