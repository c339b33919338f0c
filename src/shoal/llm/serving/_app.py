"""The LLM server's ASGI app: DJL LMI's ``/invocations``, TGI's ``/generate`` and
``/generate_stream`` (and ``POST /``), OpenAI's ``/v1/completions``, ``/v1/chat/completions``
and ``/v1/models``; ``/ping`` (and TGI's ``/health``) and ``/metrics``.

The model loads on a thread once the server listens (``/ping`` answers 503 until then).
Generation runs on the engine's thread. The events of one decode step go to the event loop
together (one ``call_soon_threadsafe`` per step); each request takes all its events that
arrived since it last looked and writes them as one chunk. A task watching the connection
cancels the generation when the client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import StrEnum
from typing import Any

from shoal.errors import ModelLoadError, OverloadedError
from shoal.llm.serving import _protocols as wire
from shoal.llm.serving._engine import Generation, TokenEvent
from shoal.llm.serving._loading import LoadedModel, load_model
from shoal.llm.serving._metrics import LlmMetrics
from shoal.llm.serving._params import GenerationParams, from_lmi, from_openai, invalid
from shoal.llm.serving._properties import LlmServingOptions
from shoal.serving._asgi import AsgiApp, Receive, Scope, Send, api_key_bytes
from shoal.serving._codecs import decode_json_document
from shoal.serving._http import (
    ClientDisconnected,
    RequestError,
    bad_request,
    read_body,
    unauthorized,
)
from shoal.serving._http import respond as _respond
from shoal.serving._options import ServerOptions

__all__ = ["LlmServerApp"]

log = logging.getLogger(__name__)


_JSON = b"application/json"
_SSE = b"text/event-stream"
_JSONLINES = b"application/jsonlines"
#: OpenAI's default ``max_tokens`` for /v1/completions
_COMPLETIONS_MAX_TOKENS = 16


class ModelState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"




class LlmServerApp(AsgiApp):
    """ASGI callable serving the LLM *options* describe.

    Example::

        app = LlmServerApp(load_serving_options(Path("model/"), {}), ServerOptions())
        uvicorn.run(app, port=8080)
    """

    def __init__(self, options: LlmServingOptions, server: ServerOptions, *,
                 on_load_error: Callable[[BaseException], None] | None = None) -> None:
        self.options = options
        self.server = server
        self.api_key = api_key_bytes(server.api_key)
        self.state = ModelState.LOADING
        self.load_error: BaseException | None = None
        self.loaded: LoadedModel | None = None
        self.model_name = options.model_id or options.base_dir.name
        self._on_load_error = on_load_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit = int(server.max_payload_mb * 1024 * 1024)
        # (channel, event) of the engine's current step; only the engine's thread touches it
        self._step_events: list[tuple[_Channel, TokenEvent]] = []
        self.metrics = LlmMetrics(
            queue_depth=lambda: self.loaded.engine.queue_depth if self.loaded else 0,
            live=lambda: self.loaded.engine.live if self.loaded else 0,
            max_batch=lambda: options.batch_size,
            loaded=lambda: float(self.state is ModelState.READY))
        self._routes: dict[str, tuple[str, Callable[..., Awaitable[int]]]] = {
            "/invocations": ("POST", self._invocations),
            "/": ("POST", self._tgi_compat),
            "/generate": ("POST", self._tgi_generate),
            "/generate_stream": ("POST", self._tgi_generate_stream),
            "/v1/completions": ("POST", self._completions),
            "/v1/chat/completions": ("POST", self._chat_completions),
            "/v1/models": ("GET", self._models),
        }

    # --- lifespan -------------------------------------------------------------------------

    def on_startup(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        threading.Thread(target=self._load, name="shoal-llm-load", daemon=True).start()
        loop.call_later(self.options.model_loading_timeout, self._load_timed_out)

    async def on_shutdown(self) -> None:
        if self.loaded is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.loaded.engine.stop)
            self.loaded.located.cleanup()

    def _load(self) -> None:
        started = time.perf_counter()
        log.info("loading the LLM of %s", self.options.base_dir)
        try:
            loaded = load_model(self.options, self.metrics)
        except BaseException as e:
            if not isinstance(e, ModelLoadError):
                e = ModelLoadError(f"loading the model failed: {type(e).__name__}: {e}")
            log.error("the model failed to load: %s", e, exc_info=e.__cause__ or e)
            self._call_soon(self._failed, e)
            return
        self._call_soon(self._ready, loaded, time.perf_counter() - started)

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    def _ready(self, loaded: LoadedModel, seconds: float) -> None:
        if self.state is not ModelState.LOADING:  # timed out meanwhile
            loaded.located.cleanup()
            return
        self.loaded = loaded
        loaded.engine.on_step = self._step_done
        loaded.engine.start()
        self.state = ModelState.READY
        log.info("model ready in %.2f s: %s", seconds, loaded.description)

    def _failed(self, error: BaseException) -> None:
        self.state = ModelState.FAILED
        self.load_error = error
        if self._on_load_error is not None:
            self._on_load_error(error)

    def _load_timed_out(self) -> None:
        if self.state is ModelState.LOADING:
            seconds = self.options.model_loading_timeout
            self._failed(ModelLoadError(
                f"the model did not load within option.model_loading_timeout={seconds:g} s; "
                f"raise it in serving.properties", key="option.model_loading_timeout"))
            log.error("%s", self.load_error)

    # --- routing --------------------------------------------------------------------------

    open_paths = frozenset({"/ping", "/health"})

    async def _unauthorized(self, scope: Scope, send: Send) -> None:
        self.metrics.request(scope["path"] if scope["path"] in self._routes else "other", 401,
                             0.0)
        await _error(send, unauthorized(), openai=scope["path"].startswith("/v1/"))

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path in ("/ping", "/health"):
            await self._ping(send)
            return
        if path == "/metrics":
            await _respond(send, 200, self.metrics.render(), self.metrics.content_type.encode())
            return
        started = time.perf_counter()
        status = 500
        openai = path.startswith("/v1/")
        try:
            route = self._routes.get(path)
            if route is None:
                raise RequestError(404, "not found", f"{method} {path}; this server answers "
                                   f"{', '.join(sorted(self._routes))}, /ping and /metrics")
            if method != route[0]:
                raise RequestError(405, "method not allowed", f"use {route[0]} {path}")
            if self.state is not ModelState.READY:
                raise self._not_ready()
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

    async def _ping(self, send: Send) -> None:
        if self.state is ModelState.READY:
            await _respond(send, 200, b'{"status":"healthy"}', _JSON)
        else:
            await _error(send, self._not_ready(), openai=False)

    def _not_ready(self) -> RequestError:
        if self.state is ModelState.FAILED:
            return RequestError(503, "model failed to load", str(self.load_error))
        return RequestError(503, "model loading", "the model is still loading; retry shortly",
                            headers=((b"retry-after", b"1"),))

    # --- LMI ------------------------------------------------------------------------------

    async def _invocations(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await self._json(scope, receive)
        if "messages" in body:  # LMI also takes OpenAI's chat schema here
            return await self._chat(body, receive, send)
        if self.options.tgi_compat:  # TGI's container: its compat route's answer
            return await self._tgi_compat_body(body, receive, send)
        _only(body, {"inputs", "parameters", "stream"})
        params = from_lmi(body.get("parameters"), full_text=self.options.return_full_text)
        stream = _flag(body, "stream")
        inputs = body.get("inputs")
        if isinstance(inputs, list) and inputs and all(isinstance(i, str) for i in inputs):
            if stream:
                raise invalid("stream=true takes one prompt in 'inputs', not a list")
            outcomes = await self._run_all(inputs, params, receive)
            await _respond_json(send, [self._lmi_result(o) for o in outcomes])
            return 200
        prompt = _prompt(inputs, "inputs")
        ids = self._encode(prompt, params)
        if not stream:
            (outcome,) = await self._run_all([prompt], params, receive, [ids])
            await _respond_json(send, self._lmi_result(outcome))
            return 200
        async with self._stream(ids, params, receive) as (channel, generation):
            outcome = wire.Outcome(prompt, len(ids), params)
            await _start(send, _JSONLINES)
            async for events in _guarded(channel, send, jsonlines=True):
                lines = []
                for event in events:
                    outcome.add(event)
                    lines.append(wire.lmi_line(event, outcome))
                await _chunk(send, b"".join(lines))
            await _chunk(send, b"", more=False)
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
        if _flag(body, "stream"):
            return await self._tgi_stream_body(body, receive, send, full_text=full_text)
        return await self._tgi_body(body, receive, send, as_list=True, full_text=full_text)

    async def _tgi_generate(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._tgi_body(await self._json(scope, receive), receive, send)

    async def _tgi_generate_stream(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._tgi_stream_body(await self._json(scope, receive), receive, send)

    async def _tgi_body(self, body: dict[str, Any], receive: Receive, send: Send, *,
                        as_list: bool = False, full_text: bool = False) -> int:
        _only(body, {"inputs", "parameters", "stream"})
        params = from_lmi(body.get("parameters"), full_text=full_text)
        prompt = _prompt(body.get("inputs"), "inputs")
        (o,) = await self._run_all([prompt], params, receive)
        result: dict[str, Any] = {"generated_text": o.full_text}
        if params.details:
            result["details"] = wire.tgi_details(o)
        await _respond_json(send, [result] if as_list else result)
        return 200

    async def _tgi_stream_body(self, body: dict[str, Any], receive: Receive, send: Send, *,
                               full_text: bool = False) -> int:
        _only(body, {"inputs", "parameters", "stream"})
        params = from_lmi(body.get("parameters"), full_text=full_text)
        prompt = _prompt(body.get("inputs"), "inputs")
        ids = self._encode(prompt, params)
        async with self._stream(ids, params, receive) as (channel, generation):
            outcome = wire.Outcome(prompt, len(ids), params)
            await _start(send, _SSE)
            index = 0
            async for events in _guarded(channel, send):
                outcome.seed = generation.seed
                chunks = []
                for event in events:
                    index += 1
                    outcome.add(event)
                    chunks.append(wire.tgi_stream_event(event, outcome, index))
                await _chunk(send, b"".join(chunks))
            await _chunk(send, b"", more=False)
        return 200

    # --- OpenAI ---------------------------------------------------------------------------

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> int:
        limit = self.loaded.max_model_len if self.loaded else None
        await _respond_json(send, {"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": int(time.time()),
             "owned_by": "shoal", "max_model_len": limit}]})
        return 200

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await self._json(scope, receive)
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and prompt \
            and all(isinstance(p, str) for p in prompt) else [_prompt(prompt, "prompt")]
        params = from_openai(body, default_max_tokens=_COMPLETIONS_MAX_TOKENS)
        return await self._openai(prompts, params, body, receive, send, chat=False)

    async def _chat_completions(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._chat(await self._json(scope, receive), receive, send)

    async def _chat(self, body: dict[str, Any], receive: Receive, send: Send) -> int:
        tokenizer = self._tokenizer()
        messages = wire.chat_prompt_messages(body.get("messages"))
        if not getattr(tokenizer, "chat_template", None):
            raise invalid("this model's tokenizer has no chat template; use /v1/completions "
                          "or /invocations with a plain prompt")
        try:
            prompt = tokenizer.apply_chat_template(messages, tokenize=False,
                                                   add_generation_prompt=True)
        except Exception as e:  # the template's own checks (roles, order) raise
            raise invalid(f"the chat template rejected the messages: {e}") from None
        room = self._max_len() - len(self._ids(prompt, chat=True))
        params = from_openai(body, default_max_tokens=max(1, room))
        return await self._openai([prompt], params, body, receive, send, chat=True)

    async def _openai(self, prompts: list[str], params: GenerationParams, body: dict[str, Any],
                      receive: Receive, send: Send, *, chat: bool) -> int:
        model = str(body.get("model") or self.model_name)
        if not _flag(body, "stream"):
            outcomes = await self._run_all(prompts, params, receive, chat=chat)
            await _respond_json(send, wire.openai_response(outcomes, chat=chat, model=model))
            return 200
        if len(prompts) != 1:
            raise invalid("stream=true takes one prompt")
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        ids = self._encode(prompts[0], params, chat=chat)
        ident = wire.openai_id(chat)
        async with self._stream(ids, params, receive) as (channel, _):
            await _start(send, _SSE)
            count = 0
            if chat:
                await _chunk(send, wire.openai_chunk(ident, chat=True, model=model, text="",
                                                     first=True))
            async for events in _guarded(channel, send):
                count += len(events)
                chunks = [wire.openai_chunk(ident, chat=chat, model=model, text=event.text,
                                            finish=event.finish)
                          for event in events if event.text or event.finish is not None]
                if chunks:
                    await _chunk(send, b"".join(chunks))
            if include_usage:
                await _chunk(send, wire.openai_chunk(ident, chat=chat, model=model, text=None,
                                                     usage_counts=wire.usage(len(ids), count)))
            await _chunk(send, b"data: [DONE]\n\n", more=False)
        return 200

    # --- generation -----------------------------------------------------------------------

    def _tokenizer(self) -> Any:
        if self.loaded is None:
            raise self._not_ready()
        return self.loaded.tokenizer

    def _max_len(self) -> int:
        return self.loaded.max_model_len if self.loaded else 0

    def _ids(self, prompt: str, *, chat: bool = False) -> list[int]:
        # a chat template writes its own special tokens
        return list(self._tokenizer()(prompt, add_special_tokens=not chat)["input_ids"])

    def _encode(self, prompt: str, params: GenerationParams, *, chat: bool = False) -> list[int]:
        """The prompt's token ids; 422 when it, or it with ``max_new_tokens``, is too long."""
        ids = self._ids(prompt, chat=chat)
        limit, n, m = self._max_len(), len(ids), params.max_new_tokens
        if n >= limit:
            raise invalid(f"the prompt has {n} tokens; this model takes at most {limit} tokens "
                          f"(prompt + generated, option.max_model_len)")
        if n + m > limit:
            raise invalid(f"the prompt's {n} tokens + max_new_tokens {m} = {n + m} exceed the "
                          f"model's limit of {limit} tokens; ask for at most {limit - n} new "
                          f"tokens")
        return ids

    @contextlib.asynccontextmanager
    async def _stream(self, ids: list[int], params: GenerationParams, receive: Receive | None
                      ) -> AsyncIterator[tuple[_Channel, Generation]]:
        """Submit one generation; yields the channel its events arrive on and the generation.
        Leaving the block (done, failed, or the client gone) frees its slot. With *receive*, a
        task watches the connection (one per request: give None when the caller watches)."""
        if self.loaded is None:
            raise self._not_ready()
        channel = _Channel()
        step_event = self._step_event
        try:
            generation = self.loaded.engine.submit(ids, params,
                                                   lambda e: step_event(channel, e))
        except OverloadedError as e:
            raise RequestError(503, "overloaded", str(e),
                               headers=((b"retry-after", b"1"),)) from None
        watcher = None if receive is None else asyncio.create_task(
            _watch_disconnect(receive, [generation]))
        try:
            yield channel, generation
        finally:
            generation.cancel()
            if watcher is not None:
                watcher.cancel()

    def _step_event(self, channel: _Channel, event: TokenEvent) -> None:
        """On the engine's thread: keep *event* for the end of the step."""
        self._step_events.append((channel, event))

    def _step_done(self) -> None:
        """On the engine's thread, after each step: one wake-up of the loop for all the
        step's events."""
        events = self._step_events
        if events:
            self._step_events = []
            self._call_soon(_deliver, events)

    async def _run_all(self, prompts: list[str], params: GenerationParams, receive: Receive,
                       ids: list[list[int]] | None = None, *, chat: bool = False
                       ) -> list[wire.Outcome]:
        """Generate for every prompt (together, in the engine's batch) to the end."""
        all_ids = ids or [self._encode(p, params, chat=chat) for p in prompts]
        async with contextlib.AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(self._stream(i, params, None))
                       for i in all_ids]
            watcher = asyncio.create_task(_watch_disconnect(receive, [g for _, g in streams]))
            stack.callback(watcher.cancel)

            async def collect(k: int) -> wire.Outcome:
                channel, generation = streams[k]
                outcome = wire.Outcome(prompts[k], len(all_ids[k]), params)
                async for events in _batches(channel):
                    for event in events:
                        outcome.add(event)
                outcome.seed = generation.seed
                return outcome

            return list(await asyncio.gather(*(collect(k) for k in range(len(prompts)))))

    async def _json(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        body = await read_body(receive, self._limit)
        data = decode_json_document(body, invalid="malformed JSON")
        if not isinstance(data, dict):
            raise bad_request(f"the body must be a JSON object, got {type(data).__name__}")
        return data



class _Channel:
    """One generation's events on the event loop: ``put`` by ``_deliver``, taken all at once
    by the request's task."""

    __slots__ = ("events", "waiter")

    def __init__(self) -> None:
        self.events: list[TokenEvent] = []
        self.waiter: asyncio.Future[None] | None = None

    def put(self, event: TokenEvent) -> None:
        self.events.append(event)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def take(self) -> list[TokenEvent]:
        """Every event that arrived since the last call (waits for one)."""
        while not self.events:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        events, self.events = self.events, []
        return events


def _deliver(events: list[tuple[_Channel, TokenEvent]]) -> None:
    """On the loop: one engine step's events to their channels."""
    for channel, event in events:
        channel.put(event)


async def _batches(channel: _Channel) -> AsyncIterator[list[TokenEvent]]:
    """The generation's events, in the batches they arrive in, up to its last; an error event
    raises (after the events before it)."""
    while True:
        events = await channel.take()
        for i, event in enumerate(events):
            if event.error is not None:
                if i:
                    yield events[:i]
                raise RequestError(500, "generation failed", event.error)
            if event.finish is not None:
                yield events[:i + 1]
                return
        yield events


async def _guarded(channel: _Channel, send: Send, *, jsonlines: bool = False
                   ) -> AsyncIterator[list[TokenEvent]]:
    """The events of *channel* in batches, ending a stream already started with an error line
    instead of raising."""
    try:
        async for events in _batches(channel):
            yield events
    except RequestError as e:
        payload = {"error": e.detail, "error_type": e.error}
        line = json.dumps(payload).encode()
        await _chunk(send, line + b"\n" if jsonlines else b"data: " + line + b"\n\n")


async def _watch_disconnect(receive: Receive, generations: list[Generation]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            for g in generations:
                g.cancel()
            return


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise invalid(f"unknown field(s) {extra}; the body takes {sorted(allowed)}")


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}")
    return value


def _prompt(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise invalid(f"'{name}' must be a non-empty string, got {value!r}")
    return value



async def _respond_json(send: Send, payload: Any) -> None:
    await _respond(send, 200, json.dumps(payload).encode(), _JSON)


async def _start(send: Send, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache")]})


async def _chunk(send: Send, data: bytes, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def _error(send: Send, error: RequestError, *, openai: bool) -> None:
    """TGI's ``{"error", "error_type"}``; OpenAI's ``{"error": {"message", "type", ...}}``
    on ``/v1`` routes."""
    if openai:
        payload: dict[str, Any] = {"object": "error", "error": {
            "message": error.detail, "type": error.error, "param": None,
            "code": error.status}}
    else:
        payload = {"error": error.detail, "error_type": error.error}
    await _respond(send, error.status, json.dumps(payload).encode(), _JSON, error.headers)
