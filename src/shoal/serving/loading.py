"""The lifecycle every model server app shares: the model loads in the background once the
server listens (``/ping`` answers 503 "model loading" meanwhile), then the app is ready, or it
failed (``/ping`` answers 503 with the reason, and ``on_load_error`` is told: the server
stops); with a load timeout, a model still loading then fails too. The model server
(``shoal.serving``), the LLM server and the LLM server's custom-handler app
(``shoal.llm.serving``) are ``LoadingApp`` subclasses.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any, Generic, TypeVar

from shoal.errors import ModelLoadError
from shoal.serving.asgi import AsgiApp, Send, api_key_bytes
from shoal.serving.http import ClientDisconnected, RequestError, respond_error

__all__ = ["LoadingApp", "ModelState", "answer"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ModelState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


class LoadingApp(AsgiApp, Generic[T]):
    """An ASGI app whose model ``load()`` returns (a ``T``) on a background thread.

    Subclasses define ``load`` (on the loading thread), ``became_ready`` (on the event loop,
    with what ``load`` returned, before ``/ping`` turns 200) and may override
    ``load_failure`` (a ``ModelLoadError`` for what ``load`` raised), ``discard`` (a model
    that loaded after the load timeout) and ``start_loading`` (where ``load`` runs).

    Servers of several workers set ``on_ready`` (told once the model is ready) and
    ``listen_when_loaded`` (the ASGI start-up, so the listening, waits for the load).
    """

    #: the loading thread's name
    load_thread_name = "shoal-model-load"

    def __init__(self, *, api_key: str | None,
                 on_load_error: Callable[[BaseException], None] | None = None,
                 load_timeout_s: float | None = None) -> None:
        self.api_key = api_key_bytes(api_key)
        self.state = ModelState.LOADING
        self.load_error: BaseException | None = None
        self.load_timeout_s = load_timeout_s
        #: told when this app's model is ready (set by a server of several workers)
        self.on_ready: Callable[[], None] | None = None
        #: whether the server listens only once the model has loaded (or failed)
        self.listen_when_loaded = False
        self._on_load_error = on_load_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._settled: asyncio.Event | None = None

    # --- what a subclass defines ------------------------------------------------------------

    @abc.abstractmethod
    def load(self) -> T:
        """Load the model (on the loading thread); raise to fail."""

    @abc.abstractmethod
    def became_ready(self, loaded: T, seconds: float) -> None:
        """On the event loop: the model *loaded* in *seconds*; start serving it."""

    def load_failure(self, error: BaseException) -> ModelLoadError:
        """The ``ModelLoadError`` that ``/ping`` reports for what ``load`` raised."""
        return ModelLoadError(f"loading the model failed: {type(error).__name__}: {error}")

    def load_timeout_message(self) -> str:
        return (f"the model did not load within option.model_loading_timeout="
                f"{self.load_timeout_s:g} s; raise it in serving.properties")

    def discard(self, loaded: T) -> None:  # noqa: B027 (a hook: most loads hold nothing)
        """Release a model that finished loading after the app had failed (timed out)."""

    def start_loading(self, target: Callable[[], None]) -> None:
        """Run *target* (the load) in the background: on a daemon thread of its own."""
        threading.Thread(target=target, name=self.load_thread_name, daemon=True).start()

    # --- the lifecycle ----------------------------------------------------------------------

    def on_startup(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._settled = asyncio.Event()
        self.start_loading(self._load)
        if self.load_timeout_s is not None:
            loop.call_later(self.load_timeout_s, self._load_timed_out)

    async def started(self) -> None:
        if self.listen_when_loaded and self._settled is not None:
            await self._settled.wait()  # loaded or failed

    def not_ready(self) -> RequestError:
        """The 503 a request gets while the model loads, or after it failed (with why)."""
        if self.state is ModelState.FAILED:
            return RequestError(503, "model failed to load", str(self.load_error))
        return RequestError(503, "model loading", "the model is still loading; retry shortly",
                            headers=((b"retry-after", b"1"),))

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the app's event loop (from any thread), unless it has closed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            loaded = self.load()
        except BaseException as e:  # anything the model's code raises, SystemExit included
            error = e if isinstance(e, ModelLoadError) else self.load_failure(e)
            log.error("the model failed to load: %s", error, exc_info=error.__cause__ or e)
            self.call_soon(self.failed, error)
            return
        self.call_soon(self._ready, loaded, time.perf_counter() - started)

    def _ready(self, loaded: T, seconds: float) -> None:
        if self.state is not ModelState.LOADING:  # timed out meanwhile
            self.discard(loaded)
            return
        self.became_ready(loaded, seconds)
        self.state = ModelState.READY
        if self.on_ready is not None:
            self.on_ready()
        if self._settled is not None:
            self._settled.set()

    def failed(self, error: BaseException) -> None:
        """On the event loop: the model cannot be served (``/ping`` says why from now on)."""
        self.state = ModelState.FAILED
        self.load_error = error
        if self._on_load_error is not None:
            self._on_load_error(error)
        if self._settled is not None:
            self._settled.set()

    def _load_timed_out(self) -> None:
        if self.state is ModelState.LOADING:
            self.failed(ModelLoadError(self.load_timeout_message(),
                                       key="option.model_loading_timeout"))
            log.error("%s", self.load_error)


async def answer(send: Send, run: Callable[[], Awaitable[int]],
                 record: Callable[[int, float], None], *, what: str = "invocation") -> None:
    """Answer one request with ``run()`` (it sends the response and returns its status): a
    ``RequestError`` it raises is sent as the JSON refusal, a client gone counts as 499, a bug
    of ours is logged and answered 500 (the server keeps serving); ``record(status,
    seconds)`` then counts the request (the metrics)."""
    started = time.perf_counter()
    status = 500
    try:
        status = await run()
    except RequestError as e:
        status = e.status
        await respond_error(send, e)
    except ClientDisconnected:
        status = 499
    except Exception as e:
        log.exception("%s failed", what)
        await respond_error(send, RequestError(500, "internal error",
                                               f"{type(e).__name__}: {e}"))
    finally:
        record(status, time.perf_counter() - started)
