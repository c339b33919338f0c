"""The LLM server's ASGI app: DJL LMI's ``/invocations``, TGI's ``/generate`` and
``/generate_stream`` (and ``POST /``), OpenAI's ``/v1/completions``, ``/v1/chat/completions``
and ``/v1/models``; ``/ping`` (and TGI's ``/health``) and ``/metrics``.

The model loads on a thread once the server listens (``/ping`` answers 503 until then).
Generation runs on the engine's thread, or in the engine's own process
(``option.shoal_engine_process``, ``_engine_process.py``), whose events a reader thread hands
on the same way. The events of one decode step go to the event loop
together (one ``call_soon_threadsafe`` per step); each request takes all its events that
arrived since it last looked and writes them as one chunk. A task watching the connection
cancels the generation when the client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from shoal.errors import ModelLoadError, OverloadedError
from shoal.llm.serving import _protocols as wire
from shoal.llm.serving._engine import Generation, TokenEvent
from shoal.llm.serving._engine_process import EngineProcess
from shoal.llm.serving._loading import LoadedModel, load_model
from shoal.llm.serving._metrics import LlmMetrics
from shoal.llm.serving._openai import OpenAIApi, default_model_name
from shoal.llm.serving._params import GenerationParams, from_lmi, invalid
from shoal.llm.serving._properties import LlmServingOptions
from shoal.llm.serving._streams import (
    Channel,
    batches,
    chunk,
    deliver,
    flag,
    guarded,
    only,
    prompt_text,
    respond_json,
    start,
    watch_disconnect,
)
from shoal.serving import ServerOptions
from shoal.serving.asgi import Receive, Scope, Send
from shoal.serving.codecs import decode_json_document
from shoal.serving.http import (
    ClientDisconnected,
    RequestError,
    bad_request,
    read_body,
    unauthorized,
)
from shoal.serving.http import respond as _respond
from shoal.serving.loading import LoadingApp, ModelState

__all__ = ["LlmServerApp"]

#: one generation to run: the prompt's text, its token ids, its parameters
Job = tuple[str, list[int], GenerationParams]

log = logging.getLogger(__name__)


_JSON = b"application/json"
_SSE = b"text/event-stream"
_JSONLINES = b"application/jsonlines"
#: OpenAI's default ``max_tokens`` for /v1/completions
_COMPLETIONS_MAX_TOKENS = 16


class LlmServerApp(LoadingApp[LoadedModel]):
    """ASGI callable serving the LLM *options* describe.

    Example::

        app = LlmServerApp(load_serving_options(Path("model/"), {}), ServerOptions())
        uvicorn.run(app, port=8080)
    """

    def __init__(self, options: LlmServingOptions, server: ServerOptions, *,
                 on_load_error: Callable[[BaseException], None] | None = None) -> None:
        super().__init__(api_key=server.api_key, on_load_error=on_load_error,
                         load_timeout_s=options.model_loading_timeout)
        self.options = options
        self.server = server
        self.loaded: LoadedModel | None = None
        names = server.served_model_name or (
            default_model_name(options.model_id, options.base_dir.name),)
        self.model_name = names[0]
        self.openai = OpenAIApi(self, names)
        self._limit = int(server.max_payload_mb * 1024 * 1024)
        # (channel, event) of the engine's current step; only the engine's thread touches it
        self._step_events: list[tuple[Channel, TokenEvent]] = []
        self.metrics = LlmMetrics(
            queue_depth=lambda: self.loaded.engine.queue_depth if self.loaded else 0,
            live=lambda: self.loaded.engine.live if self.loaded else 0,
            max_batch=lambda: options.batch_size,
            loaded=lambda: float(self.state is ModelState.READY), model_name=names[0])
        self._routes: dict[str, tuple[str, Callable[..., Awaitable[int]]]] = {
            "/invocations": ("POST", self._invocations),
            "/": ("POST", self._tgi_compat),
            "/generate": ("POST", self._tgi_generate),
            "/generate_stream": ("POST", self._tgi_generate_stream),
            "/v1/completions": ("POST", self.openai.completions),
            "/v1/chat/completions": ("POST", self.openai.chat_completions),
            "/v1/models": ("GET", self.openai.models),
            "/v1/embeddings": ("POST", self.openai.embeddings),
            "/tokenize": ("POST", self.openai.tokenize),
            "/detokenize": ("POST", self.openai.detokenize),
        }

    # --- lifespan -------------------------------------------------------------------------

    load_thread_name = "shoal-llm-load"

    async def on_shutdown(self) -> None:
        if self.loaded is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.loaded.engine.stop)
            self.loaded.located.cleanup()

    def load(self) -> LoadedModel:
        log.info("loading the LLM of %s", self.options.base_dir)
        return load_model(self.options, self.metrics)

    def discard(self, loaded: LoadedModel) -> None:
        if isinstance(loaded.engine, EngineProcess):
            loaded.engine.stop()
        loaded.located.cleanup()

    def became_ready(self, loaded: LoadedModel, seconds: float) -> None:
        self.loaded = loaded
        engine = loaded.engine
        engine.on_step = self._step_done
        if isinstance(engine, EngineProcess):  # its end is the model's: /ping says why
            engine.on_exit = lambda why: self.call_soon(
                self.failed, ModelLoadError(why, path=str(loaded.located.path)))
        engine.start()
        log.info("model ready in %.2f s: %s", seconds, loaded.description)

    # --- routing --------------------------------------------------------------------------

    open_paths = frozenset({"/ping", "/health"})

    async def _unauthorized(self, scope: Scope, send: Send) -> None:
        self.metrics.request(scope["path"] if scope["path"] in self._routes else "other", 401,
                             0.0)
        await _error(send, unauthorized(), openai=scope["path"].startswith("/v1/"))

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path in ("/ping", "/health"):
            await self._ping(send, empty=path == "/health")
            return
        if path == "/metrics":
            await _respond(send, 200, self.metrics.render(), self.metrics.content_type.encode())
            return
        if path == "/version":
            await respond_json(send, {"version": _version()})
            return
        started = time.perf_counter()
        status = 500
        openai = path.startswith("/v1/") or path in _VLLM_ROUTES
        try:
            route = self._routes.get(path)
            if route is None:
                raise RequestError(404, "not found", f"{method} {path}; this server answers "
                                   f"{', '.join(sorted(self._routes))}, /ping, /health, "
                                   f"/version and /metrics")
            if method != route[0]:
                raise RequestError(405, "method not allowed", f"use {route[0]} {path}")
            if self.state is not ModelState.READY:
                raise self.not_ready()
            status = await route[1](scope, receive, send)
        except RequestError as e:
            status = e.status
            await _error(send, e, openai=openai)
        except ClientDisconnected:
            status = 499
        except Exception as e:  # a bug of ours: answer 500 and keep serving
            log.exception("%s %s failed", method, path)
            await _error(send, RequestError(500, "internal error", f"{type(e).__name__}: {e}"),
                         openai=openai)
        finally:
            self.metrics.request(path if path in self._routes else "other", status,
                                 time.perf_counter() - started)

    async def _ping(self, send: Send, *, empty: bool = False) -> None:
        """``/ping`` (SageMaker) answers a JSON status; ``/health`` (vLLM, TGI) an empty 200."""
        if self.state is ModelState.READY:
            await _respond(send, 200, b"" if empty else b'{"status":"healthy"}', _JSON)
        else:
            await _error(send, self.not_ready(), openai=False)

    # --- LMI ------------------------------------------------------------------------------

    async def _invocations(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await self._json(scope, receive)
        if "messages" in body:  # LMI also takes OpenAI's chat schema here
            return await self.openai.chat(body, receive, send)
        if self.options.tgi_compat:  # TGI's container: its compat route's answer
            return await self._tgi_compat_body(body, receive, send)
        only(body, {"inputs", "parameters", "stream"})
        params = from_lmi(body.get("parameters"), full_text=self.options.return_full_text)
        stream = flag(body, "stream")
        inputs = body.get("inputs")
        if isinstance(inputs, list) and inputs and all(isinstance(i, str) for i in inputs):
            if stream:
                raise invalid("stream=true takes one prompt in 'inputs', not a list")
            outcomes = await self.run_all([(i, self.encode(i, params), params) for i in inputs],
                                          receive)
            await respond_json(send, [self._lmi_result(o) for o in outcomes])
            return 200
        prompt = prompt_text(inputs, "inputs")
        ids = self.encode(prompt, params)
        if not stream:
            (outcome,) = await self.run_all([(prompt, ids, params)], receive)
            await respond_json(send, self._lmi_result(outcome))
            return 200
        async with self._stream(ids, params, receive) as (channel, generation):
            outcome = wire.Outcome(prompt, len(ids), params)
            await start(send, _JSONLINES)
            async for events in guarded(channel, send, jsonlines=True):
                lines = []
                for event in events:
                    outcome.add(event)
                    lines.append(wire.lmi_line(event, outcome))
                await chunk(send, b"".join(lines))
            await chunk(send, b"", more=False)
        return 200

    def _lmi_result(self, o: wire.Outcome) -> dict[str, Any]:
        result: dict[str, Any] = {"generated_text": o.full_text}
        if o.params.details:
            result["details"] = wire.lmi_details(o)
        return result

    # --- TGI ------------------------------------------------------------------------------

    async def _tgi_compat(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._tgi_compat_body(await self._json(scope, receive), receive, send)

    async def _tgi_compat_body(self, body: dict[str, Any], receive: Receive, send: Send) -> int:
        """TGI's ``POST /`` (and its SageMaker ``/invocations``): a one-element list, or SSE
        with ``stream``; ``return_full_text`` defaults to ``option.return_full_text``."""
        if isinstance(body.get("inputs"), list):
            raise invalid("TGI's API takes one prompt: 'inputs' must be a string, not a list "
                          "(send one request per prompt, or serve with option.tgi_compat=false "
                          "for LMI's list form)")
        full_text = self.options.return_full_text
        if flag(body, "stream"):
            return await self._tgi_stream_body(body, receive, send, full_text=full_text)
        return await self._tgi_body(body, receive, send, as_list=True, full_text=full_text)

    async def _tgi_generate(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._tgi_body(await self._json(scope, receive), receive, send)

    async def _tgi_generate_stream(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._tgi_stream_body(await self._json(scope, receive), receive, send)

    async def _tgi_body(self, body: dict[str, Any], receive: Receive, send: Send, *,
                        as_list: bool = False, full_text: bool = False) -> int:
        only(body, {"inputs", "parameters", "stream"})
        params = from_lmi(body.get("parameters"), full_text=full_text)
        prompt = prompt_text(body.get("inputs"), "inputs")
        (o,) = await self.run_all([(prompt, self.encode(prompt, params), params)], receive)
        result: dict[str, Any] = {"generated_text": o.full_text}
        if params.details:
            result["details"] = wire.tgi_details(o)
        await respond_json(send, [result] if as_list else result)
        return 200

    async def _tgi_stream_body(self, body: dict[str, Any], receive: Receive, send: Send, *,
                               full_text: bool = False) -> int:
        only(body, {"inputs", "parameters", "stream"})
        params = from_lmi(body.get("parameters"), full_text=full_text)
        prompt = prompt_text(body.get("inputs"), "inputs")
        ids = self.encode(prompt, params)
        async with self._stream(ids, params, receive) as (channel, generation):
            outcome = wire.Outcome(prompt, len(ids), params)
            await start(send, _SSE)
            index = 0
            async for events in guarded(channel, send):
                outcome.seed = generation.seed
                chunks = []
                for event in events:
                    index += 1
                    outcome.add(event)
                    chunks.append(wire.tgi_stream_event(event, outcome, index))
                await chunk(send, b"".join(chunks))
            await chunk(send, b"", more=False)
        return 200

    # --- generation -----------------------------------------------------------------------

    def tokenizer(self) -> Any:
        if self.loaded is None:
            raise self.not_ready()
        return self.loaded.tokenizer

    def max_len(self) -> int:
        return self.loaded.max_model_len if self.loaded else 0

    def vocab_size(self) -> int:
        engine: Any = self.loaded.engine if self.loaded else None
        return int(getattr(engine, "vocab_size", 0) or len(self.tokenizer()))

    def token_ids(self, prompt: str, *, chat: bool = False) -> list[int]:
        # a chat template writes its own special tokens
        return list(self.tokenizer()(prompt, add_special_tokens=not chat)["input_ids"])

    def encode(self, prompt: str, params: GenerationParams, *, chat: bool = False) -> list[int]:
        """The prompt's token ids; 422 when it, or it with ``max_new_tokens``, is too long."""
        return self.check_length(self.token_ids(prompt, chat=chat), params)

    def check_length(self, ids: list[int], params: GenerationParams) -> list[int]:
        """*ids*, when they and ``max_new_tokens`` fit the model (422 otherwise), and every
        ``logit_bias`` token is in the vocabulary."""
        limit, n, m = self.max_len(), len(ids), params.max_new_tokens
        if n >= limit:
            raise invalid(f"the prompt has {n} tokens; this model takes at most {limit} tokens "
                          f"(prompt + generated, option.max_model_len)")
        if n + m > limit:
            raise invalid(f"the prompt's {n} tokens + max_new_tokens {m} = {n + m} exceed the "
                          f"model's limit of {limit} tokens; ask for at most {limit - n} new "
                          f"tokens", "max_tokens")
        if params.logit_bias:
            vocab = self.vocab_size()
            bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
            if bad:
                raise invalid(f"logit_bias names token ids outside the vocabulary "
                              f"(0..{vocab - 1}): {bad[:5]}", "logit_bias")
        return ids

    @contextlib.asynccontextmanager
    async def _stream(self, ids: list[int], params: GenerationParams, receive: Receive | None
                      ) -> AsyncIterator[tuple[Channel, Generation]]:
        """Submit one generation; yields the channel its events arrive on and the generation.
        Leaving the block (done, failed, or the client gone) frees its slot. With *receive*, a
        task watches the connection (one per request: give None when the caller watches)."""
        if self.loaded is None:
            raise self.not_ready()
        channel = Channel()
        step_event = self._step_event
        engine: Any = self.loaded.engine
        try:
            generation = engine.submit(ids, params, lambda e: step_event(channel, e))
        except OverloadedError as e:
            raise RequestError(503, "overloaded", str(e),
                               headers=((b"retry-after", b"1"),)) from None
        watcher = None if receive is None else asyncio.create_task(
            watch_disconnect(receive, [generation], [channel]))
        try:
            yield channel, generation
        finally:
            generation.cancel()
            if watcher is not None:
                watcher.cancel()

    @contextlib.asynccontextmanager
    async def streams(self, jobs: list[Job], receive: Receive
                      ) -> AsyncIterator[list[Channel]]:
        """Submit every job (prompt, ids, params); yields their channels, in order. One task
        watches the connection for all; leaving the block frees every slot."""
        async with contextlib.AsyncExitStack() as stack:
            pairs = [await stack.enter_async_context(self._stream(ids, params, None))
                     for _, ids, params in jobs]
            watcher = asyncio.create_task(watch_disconnect(receive, [g for _, g in pairs],
                                                            [c for c, _ in pairs]))
            stack.callback(watcher.cancel)
            yield [channel for channel, _ in pairs]

    def _step_event(self, channel: Channel, event: TokenEvent) -> None:
        """On the engine's thread: keep *event* for the end of the step."""
        self._step_events.append((channel, event))

    def _step_done(self) -> None:
        """On the engine's thread, after each step: one wake-up of the loop for all the
        step's events."""
        events = self._step_events
        if events:
            self._step_events = []
            self.call_soon(deliver, events)

    async def run_all(self, jobs: list[Job], receive: Receive) -> list[wire.Outcome]:
        """Generate every job (prompt, ids, params) to its end, together in the engine's
        batch."""
        async with contextlib.AsyncExitStack() as stack:
            pairs = [await stack.enter_async_context(self._stream(ids, params, None))
                     for _, ids, params in jobs]
            watcher = asyncio.create_task(watch_disconnect(receive, [g for _, g in pairs],
                                                            [c for c, _ in pairs]))
            stack.callback(watcher.cancel)

            async def collect(k: int) -> wire.Outcome:
                channel, generation = pairs[k]
                prompt, ids, params = jobs[k]
                outcome = wire.Outcome(prompt, len(ids), params)
                async for events in batches(channel):
                    for event in events:
                        outcome.add(event)
                outcome.seed = generation.seed
                return outcome

            return list(await asyncio.gather(*(collect(k) for k in range(len(jobs)))))

    async def json_body(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        return await self._json(scope, receive)

    async def _json(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        body = await read_body(receive, self._limit)
        data = decode_json_document(body, invalid="malformed JSON")
        if not isinstance(data, dict):
            raise bad_request(f"the body must be a JSON object, got {type(data).__name__}")
        return data



#: vLLM's routes outside /v1 that answer errors in OpenAI's shape
_VLLM_ROUTES = frozenset({"/tokenize", "/detokenize"})
#: vLLM's error ``type`` for a status
_OPENAI_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
                       413: "RequestEntityTooLarge", 500: "InternalServerError",
                       503: "ServiceUnavailableError", 504: "GatewayTimeout"}


async def _error(send: Send, error: RequestError, *, openai: bool) -> None:
    """TGI's ``{"error", "error_type"}``; OpenAI's ``{"error": {"message", "type", "param",
    "code"}}`` on the OpenAI routes, where a request that cannot be served as asked is 400
    (TGI's 422), as vLLM answers."""
    if openai:
        status = 400 if error.status == 422 else error.status
        payload: dict[str, Any] = {"error": {
            "message": error.detail, "type": _OPENAI_ERROR_TYPES.get(status, error.error),
            "param": getattr(error, "param", None), "code": status}}
    else:
        status = error.status
        payload = {"error": error.detail, "error_type": error.error}
    await _respond(send, status, json.dumps(payload).encode(), _JSON, error.headers)


def _version() -> str:
    from shoal import __version__

    return str(__version__)
