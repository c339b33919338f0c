"""The model server's ASGI app: ``/ping``, ``/invocations``, ``/metrics`` and
``/execution-parameters`` (SageMaker's serving contract), written against raw ASGI because the
invocation path is the hot one.

The model loads on a background thread once the server listens, so ``/ping`` answers 503 at
once and 200 when the model is ready. Inference runs on the ``InferenceQueue``'s thread, never
on the event loop, so a slow or hung model does not stop ``/ping`` or ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from shoal.errors import ModelLoadError
from shoal.serving import codecs
from shoal.serving._batching import InferenceQueue
from shoal.serving._guard import Reply
from shoal.serving._handlers import Handler, select_handler
from shoal.serving._options import ServerOptions
from shoal.serving.artifact import ResolvedModel, resolve_model
from shoal.serving.asgi import Receive, Scope, Send, authorized
from shoal.serving.http import RequestError, error_body, read_body, unauthorized
from shoal.serving.http import respond as _respond
from shoal.serving.http import respond_error as _error
from shoal.serving.loading import LoadingApp, ModelState, answer
from shoal.serving.metrics import ServerMetrics

__all__ = ["ModelServerApp", "ModelState", "create_app"]

log = logging.getLogger(__name__)


#: Bodies above this are decoded on a helper thread, so parsing them does not stall /ping.
_INLINE_DECODE_BYTES = 256 * 1024
_JSON = b"application/json"


def create_app(model_dir: str | os.PathLike[str], *, options: ServerOptions,
               on_load_error: Callable[[BaseException], None] | None = None) -> ModelServerApp:
    """The ASGI app serving the model in *model_dir* (a directory, ``model.tar.gz`` or URL).

    Choosing the handler is immediate: a directory without a recognisable model or
    ``code/inference.py`` raises ``ModelLoadError`` naming the files it holds. Loading happens
    in the background when the app starts (ASGI lifespan); a failure is logged with its
    traceback, leaves ``/ping`` at 503 and calls *on_load_error*.

    Example::

        app = create_app("model/", options=ServerOptions(max_batch_size=16))
        uvicorn.run(app, port=8080)
    """
    resolved = resolve_model(model_dir)
    try:
        handler = select_handler(resolved.path, options)
    except BaseException:
        resolved.cleanup()
        raise
    return ModelServerApp(handler, options, resolved=resolved, on_load_error=on_load_error)


class ModelServerApp(LoadingApp[None]):
    """ASGI callable; build it with ``create_app``."""

    def __init__(self, handler: Handler, options: ServerOptions, *, resolved: ResolvedModel,
                 on_load_error: Callable[[BaseException], None] | None = None) -> None:
        super().__init__(api_key=options.api_key, on_load_error=on_load_error)
        self.handler = handler
        self.options = options
        self._resolved = resolved
        self._queue: InferenceQueue | None = None
        self._limit = int(options.max_payload_mb * 1024 * 1024)
        self._negotiated: dict[tuple[bytes | None, bytes | None],
                               tuple[str, str] | RequestError] = {}
        self.metrics = ServerMetrics(
            queue_depth=lambda: self._queue.depth if self._queue is not None else 0,
            loaded=lambda: float(self.state is ModelState.READY))
        #: set by a server of several workers: whether the others have their model too
        self.others_ready: Callable[[], bool] | None = None

    # --- lifespan ---------------------------------------------------------------------------

    async def on_shutdown(self) -> None:
        if self._queue is not None:
            await self._queue.close()
        self._resolved.cleanup()

    def load(self) -> None:
        log.info("loading %s from %s", self.handler.describe(), self.handler.model_dir)
        self.handler.load()

    def load_failure(self, error: BaseException) -> ModelLoadError:
        return ModelLoadError(f"loading {self.handler.describe()} failed: "
                              f"{type(error).__name__}: {error}")

    def became_ready(self, loaded: None, seconds: float) -> None:
        handler = self.handler
        size, delay = self.options.batch_limits(batchable=handler.batchable)
        if self.options.batching_requested and not handler.batchable:
            log.warning("max_batch_size=%s asked for, but %s cannot batch (an ONNX model needs a "
                        "symbolic first input axis; a predict_fn needs BATCHABLE = True): "
                        "serving one request at a time", self.options.max_batch_size,
                        handler.describe())
        self._queue = InferenceQueue(handler.predict, max_batch_size=size,
                                     max_batch_delay_s=delay, max_queue=self.options.max_queue,
                                     on_batch=self.metrics.batch)
        self._queue.start()
        batching = f"batches of up to {size}, {delay * 1000:g} ms delay" if size > 1 \
            else "no batching"
        log.info("model ready in %.2f s: %s, %s", seconds, handler.describe(), batching)

    # --- routes -----------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/invocations":
            if method == "POST":
                await self._invoke(scope, receive, send)
            else:
                await _error(send, RequestError(405, "method not allowed", "POST /invocations"))
        elif path == "/ping":
            await self._ping(send, head=method == "HEAD")
        elif path == "/metrics" and method == "GET":
            await _respond(send, 200, self.metrics.render(),
                           self.metrics.content_type.encode())
        elif path == "/execution-parameters" and method == "GET":
            await self._execution_parameters(send)
        else:
            await _error(send, RequestError(404, "not found",
                                            f"{method} {path}: this server answers GET /ping, "
                                            f"POST /invocations, GET /metrics and GET "
                                            f"/execution-parameters"))

    async def _ping(self, send: Send, *, head: bool) -> None:
        if self.state is ModelState.READY and (self.others_ready is None or self.others_ready()):
            await _respond(send, 200, b"" if head else b'{"status":"healthy"}', _JSON)
        elif self.state is ModelState.READY:
            await _error(send, RequestError(503, "model loading", "another worker of this "
                                            "server is still loading the model; retry shortly",
                                            headers=((b"retry-after", b"1"),)))
        else:
            await _error(send, self.not_ready())

    async def _execution_parameters(self, send: Send) -> None:
        if self.state is not ModelState.READY:
            await _error(send, self.not_ready())
            return
        size, _ = self.options.batch_limits(batchable=self.handler.batchable)
        body = {"MaxConcurrentTransforms": (self.options.workers or 1) * size,
                "BatchStrategy": "MULTI_RECORD" if self.handler.multi_record else "SINGLE_RECORD",
                "MaxPayloadInMB": max(1, int(self.options.max_payload_mb))}
        await _respond(send, 200, json.dumps(body).encode(), _JSON)

    async def _invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def run() -> int:
            queue = self._ready_queue()
            raw_type, raw_accept, length = _headers(scope["headers"])
            content_type, response_type = self._types(raw_type, raw_accept)
            handler = self.handler
            body = await read_body(receive, self._limit, length)
            if len(body) > _INLINE_DECODE_BYTES:
                data = await asyncio.get_running_loop().run_in_executor(
                    None, handler.decode, body, content_type, response_type)
            else:
                data = handler.decode(body, content_type, response_type)
            prediction = await queue.submit(data, self.options.timeout_s)
            payload, payload_type = handler.encode(prediction, response_type)
            await _respond(send, 200, payload, payload_type.encode())
            return 200

        await answer(send, run, self.metrics.request)

    def _ready_queue(self) -> InferenceQueue:
        if self.state is not ModelState.READY or self._queue is None:
            raise self.not_ready()
        return self._queue

    # --- the fast path (shoal.serving._guard): POST /invocations without ASGI -----------------
    # The same steps as _invoke, for a body small enough to decode on the event loop, with
    # the same answers (tests/integration/test_serving_fast_path.py compares the two).

    fast_paths = frozenset({b"/invocations"})

    @property
    def fast_body_limit(self) -> int:
        return min(self._limit, _INLINE_DECODE_BYTES)

    def fast_call(self, headers: list[tuple[bytes, bytes]], body: bytes, reply: Reply) -> None:
        started = time.perf_counter()
        if self.api_key is not None and not authorized(headers, self.api_key):
            error = unauthorized()  # as AsgiApp refuses it: before routing, not counted
            reply(error.status, error_body(error.error, error.detail), _JSON, error.headers)
            return
        try:
            queue = self._ready_queue()
            raw_type, raw_accept, _ = _headers(headers)
            content_type, response_type = self._types(raw_type, raw_accept)
            data = self.handler.decode(body, content_type, response_type)

            def answer(prediction: Any) -> None:
                if isinstance(prediction, Exception):
                    self._fast_failed(prediction, reply, started)
                    return
                try:
                    payload, payload_type = self.handler.encode(prediction, response_type)
                except Exception as e:
                    self._fast_failed(e, reply, started)
                    return
                reply(200, payload, payload_type.encode(), ())
                self.metrics.request(200, time.perf_counter() - started)

            queue.put(data, self.options.timeout_s, answer)
        except Exception as e:
            self._fast_failed(e, reply, started)

    def _fast_failed(self, e: Exception, reply: Reply, started: float) -> None:
        """What ``answer`` does with an exception: a ``RequestError`` as the JSON refusal,
        anything else logged and answered 500."""
        if not isinstance(e, RequestError):
            log.exception("invocation failed", exc_info=e)
            e = RequestError(500, "internal error", f"{type(e).__name__}: {e}")
        reply(e.status, error_body(e.error, e.detail), _JSON, e.headers)
        self.metrics.request(e.status, time.perf_counter() - started)

    def _types(self, raw_type: bytes | None, raw_accept: bytes | None) -> tuple[str, str]:
        """``(content type, response type)`` for a request's Content-Type and Accept headers,
        or the 415/406 refusal. Clients repeat the same headers: each answer is remembered."""
        key = (raw_type, raw_accept)
        known = self._negotiated.get(key)
        if known is None:
            known = self._work_out_types(raw_type, raw_accept)
            if len(self._negotiated) < 256:
                self._negotiated[key] = known
        if isinstance(known, RequestError):
            raise RequestError(known.status, known.error, known.detail)
        return known

    def _work_out_types(self, raw_type: bytes | None,
                        raw_accept: bytes | None) -> tuple[str, str] | RequestError:
        content_type = codecs.media_type(None if raw_type is None
                                          else raw_type.decode("latin-1"))
        accepted = self.handler.content_types
        try:
            if accepted is not None and content_type not in accepted:
                raise codecs.unsupported(content_type, accepted)
            accept = None if raw_accept is None else raw_accept.decode("latin-1")
            return content_type, codecs.negotiate(accept, content_type, self.handler.accepts)
        except RequestError as e:
            return e


def _headers(headers: list[tuple[bytes, bytes]]
             ) -> tuple[bytes | None, bytes | None, int | None]:
    """The raw Content-Type and Accept headers and the Content-Length."""
    content_type: bytes | None = None
    accept: bytes | None = None
    length: int | None = None
    for name, value in headers:
        if name == b"content-type":
            content_type = value
        elif name == b"accept":
            accept = value
        elif name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise RequestError(400, "bad request", "Content-Length is not a number") from None
    return content_type, accept, length


