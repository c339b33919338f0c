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
from collections.abc import Callable
from pathlib import Path
from typing import Any

# shoal's private json codec: user code may patch json, and must not corrupt our envelopes.
from shoal._internal.jsoncodec import dumps as _json_dumps
from shoal._internal.secrets import mask_text, secret_values
from shoal.errors import PayloadIntegrityError, PayloadVersionError, SerializationError
from shoal.serialization import Payload, deserialize, serialize

__all__ = ["EXIT_OK", "EXIT_RAISED", "EXIT_REFUSED", "JOB_END_HOOKS", "execute", "main", "run"]

EXIT_OK, EXIT_RAISED, EXIT_REFUSED = 0, 1, 3

#: Called once, then forgotten, when the job's function has returned or raised and before its
#: outcome is reported. Libraries that buffer (experiment metrics) flush here: a forked job
#: leaves with os._exit, so atexit handlers never run.
JOB_END_HOOKS: list[Callable[[], None]] = []


def _job_ended() -> None:
    while JOB_END_HOOKS:
        hook = JOB_END_HOOKS.pop(0)
        try:
            hook()
        except BaseException:  # reported in the job's log; the function's outcome stands
            sys.stderr.write(f"shoal: a job-end hook failed:\n{traceback.format_exc()}")


def _read(workdir: Path, name: str) -> Payload:
    return Payload((workdir / f"{name}.pkl").read_bytes(),
                   (workdir / f"{name}.json").read_bytes())


def _write(workdir: Path, name: str, payload: Payload) -> None:
    # The pickle first, its metadata last: whoever finds the metadata finds the whole payload.
    for fname, data in ((f"{name}.pkl", payload.data), (f"{name}.json", payload.metadata)):
        tmp = workdir / f".{fname}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, workdir / fname)


def execute(function: Payload, arguments: Payload, key: str) -> tuple[int, dict[str, Any]]:
    """Verify, unpickle, call, pickle: the job itself, with no I/O of its own.

    Returns the exit code and what to hand back: ``{"results": Payload}``, or
    ``{"exception": Payload, "summary": {...}}``, or ``{"error": {"kind", "message"}}`` for a
    payload that was refused.
    """
    # The secret values this job can see, taken before its code runs: an exception that
    # quotes one is reported (summary, message, traceback, its string arguments) masked.
    hidden = secret_values(os.environ)
    try:
        func = deserialize(function, key, what="function payload")
        args, kwargs = deserialize(arguments, key, what="arguments payload")
    except PayloadIntegrityError as e:
        return _refused("integrity", str(e))
    except PayloadVersionError as e:
        return _refused("version", str(e))
    except SerializationError as e:
        return _refused("user_error", str(e))
    try:
        result = func(*args, **kwargs)
    except BaseException as e:  # the user's exception, SystemExit and KeyboardInterrupt too
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        _job_ended()
        return EXIT_RAISED, _exception(e, tb, key, hidden)
    _job_ended()
    try:
        payload = serialize(result, key, what=f"result of type {type(result).__qualname__}")
    except SerializationError as e:
        tb = traceback.format_exc()
        sys.stderr.write(f"shoal: {e}\n")
        return EXIT_RAISED, _exception(e, tb, key, hidden)
    return EXIT_OK, {"results": payload}


def _refused(kind: str, message: str) -> tuple[int, dict[str, Any]]:
    sys.stderr.write(f"shoal: {message}\n")
    return EXIT_REFUSED, {"error": {"kind": kind, "message": message}}


def _exception(exc: BaseException, tb: str, key: str, hidden: tuple[str, ...] = ()
               ) -> dict[str, Any]:
    if hidden:
        _mask_args(exc, hidden)
        tb = mask_text(tb, hidden)
    summary = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
               "message": mask_text(str(exc), hidden)[:2000]}
    return {"exception": _exception_payload(exc, tb, key, hidden), "summary": summary}


def _mask_args(exc: BaseException, hidden: tuple[str, ...]) -> None:
    """Mask secret values in the exception's string arguments (what ``str(exc)`` shows for
    most exceptions); an exception that refuses is reported as it is."""
    try:
        exc.args = tuple(mask_text(a, hidden) if isinstance(a, str) else a for a in exc.args)
    except Exception:  # a user's exception class may forbid it
        pass


def run(workdir: Path, key: str) -> int:
    """The file protocol: payloads in WORKDIR, outcome written back there."""
    code, out = execute(_read(workdir, "function"), _read(workdir, "arguments"), key)
    if "results" in out:
        _write(workdir, "results", out["results"])
    elif "exception" in out:
        _write(workdir, "exception", out["exception"])
        (workdir / "exception.summary.json").write_text(_json_dumps(out["summary"]))
    else:
        (workdir / "shoal_error.json").write_text(_json_dumps(out["error"]))
    return code


def _exception_payload(exc: BaseException, tb: str, key: str,
                       hidden: tuple[str, ...] = ()) -> Payload:
    info = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": mask_text(str(exc), hidden), "traceback": tb}
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
