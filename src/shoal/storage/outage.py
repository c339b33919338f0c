"""Riding out a metadata store that is briefly unreachable (a PostgreSQL restart, a failover).

Every supervisor and client talks to the store through :class:`OutageTolerant`: a call that
fails because the server cannot be reached (``MetadataStoreError`` with ``transient``) is
tried again, with a growing pause, until it succeeds or the outage has lasted
``store_outage_seconds`` (``SHOAL_STORE_OUTAGE_SECONDS``, default 60 s). Meanwhile the caller
waits where it is: a supervisor's transitions, metrics and handles are written in their order
once the store answers, and the user's code, in its own process, runs on. A write retried
after its first try may have been committed (the answer was lost with the connection): a
transition that finds the job already where it was moving is taken as done, and a job created
already is returned. After the limit: one clear error naming the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from shoal.errors import (
    AlreadyExistsError,
    ArtifactStoreError,
    InvalidTransitionError,
    MetadataStoreError,
    StorageError,
)

__all__ = ["DEFAULT_OUTAGE_SECONDS", "OutageTolerant", "tolerant"]

logger = logging.getLogger(__name__)

DEFAULT_OUTAGE_SECONDS = 60.0
_FIRST_PAUSE_S = 0.2
_MOST_PAUSE_S = 2.0


def is_transient(error: BaseException) -> bool:
    """A store error that says the store could not be reached (worth waiting for)."""
    return isinstance(error, StorageError) and bool(error.details.get("transient"))


class OutageTolerant:
    """A metadata (or artifact) store whose calls wait out an outage of up to *seconds*
    (see module)."""

    def __init__(self, store: Any, *, seconds: float = DEFAULT_OUTAGE_SECONDS,
                 shown: str = "", sleep: Callable[[float], None] = time.sleep) -> None:
        self._store = store
        self._seconds = float(seconds)
        self._shown = shown or "the metadata store"
        self._sleep = sleep

    @property
    def seconds(self) -> float:
        return self._seconds

    @property
    def inner(self) -> Any:
        return self._store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr) or name.startswith("_") or name in ("close",):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, attr, args, kwargs)

        call.__name__ = name
        return call

    def _call(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        started: float | None = None
        pause = _FIRST_PAUSE_S
        while True:
            try:
                return fn(*args, **kwargs)
            except StorageError as e:
                if not is_transient(e) or self._seconds <= 0:
                    raise
                now = time.monotonic()
                if started is None:
                    started = now
                    logger.warning("%s does not answer (%s); %s waits up to %.0f s for it",
                                   self._shown, e, name, self._seconds)
                if now - started >= self._seconds:
                    kind = ArtifactStoreError if isinstance(e, ArtifactStoreError) \
                        else MetadataStoreError
                    what = "artifact" if kind is ArtifactStoreError else "metadata"
                    raise kind(
                        f"the {what} store {self._shown} has not answered for "
                        f"{self._seconds:g} s (SHOAL_STORE_OUTAGE_SECONDS): {e}",
                        url=self._shown, transient=False) from e
            except (InvalidTransitionError, AlreadyExistsError):
                if started is None:
                    raise
                done = self._already_done(name, args, kwargs)
                if done is _NOT_DONE:
                    raise
                return done
            self._sleep(pause)
            pause = min(pause * 2, _MOST_PAUSE_S)

    def _already_done(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """After a lost answer: whether the retried write had been committed by its first
        try (what it would have returned), else _NOT_DONE."""
        if name == "update_job":
            job = args[0] if args else kwargs["name"]
            record = self._store.get_job(job)
            wanted = kwargs.get("attempt")
            if record.status == kwargs.get("status") and (wanted is None
                                                          or record.attempt == wanted):
                return record if kwargs.get("want_record", True) else None
        if name == "create_job":
            spec = args[0] if args else kwargs["spec"]
            return self._store.get_job(spec.name)
        return _NOT_DONE

    def close(self) -> None:
        self._store.close()


_NOT_DONE = object()

S = TypeVar("S")


def tolerant(store: S, *, seconds: float = DEFAULT_OUTAGE_SECONDS, shown: str = "") -> S:
    """*store* behind an :class:`OutageTolerant`, typed as *store*: the proxy answers each of
    its public methods with the same signature and result (the cast says what ``__getattr__``
    cannot tell the type checker)."""
    return cast(S, OutageTolerant(store, seconds=seconds, shown=shown))
