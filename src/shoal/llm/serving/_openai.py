"""OpenAI's API as vLLM serves it: ``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``, ``/v1/embeddings``, and vLLM's ``/tokenize``, ``/detokenize`` and
``/version``.

The ``model`` field must be one of the served names (``--served-model-name``; by default the
model's hub id, else its directory's name), else 404. ``n`` choices are ``n`` generations in
the engine's batch (seeded ``seed``, ``seed + 1``, ... as vLLM seeds them); ``logprobs`` come
from the engine's token events; ``response_format`` other than text, and ``tools`` with a
``tool_choice`` that needs a tool-call parser, are refused with 400 naming the field. Errors
are OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (the app writes them).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import struct
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from shoal.llm.serving import _protocols as wire
from shoal.llm.serving._engine import TokenEvent
from shoal.llm.serving._params import (
    GenerationParams,
    OpenAIRequest,
    ParamError,
    invalid,
    openai_request,
)
from shoal.llm.serving._streams import (
    Channel,
    chunk,
    flag,
    guarded,
    prompt_text,
    respond_json,
    start,
)
from shoal.serving.asgi import Receive, Scope, Send

if TYPE_CHECKING:
    from shoal.llm.serving._app import LlmServerApp

__all__ = ["OpenAIApi", "default_model_name"]

_SSE = b"text/event-stream"
#: OpenAI's default ``max_tokens`` for /v1/completions
_COMPLETIONS_MAX_TOKENS = 16


def default_model_name(model_id: str | None, base_dir_name: str) -> str:
    """The name a model answers to by default: an ``option.model_id`` that is a hub id
    (``org/name``) as written, as vLLM uses its ``--model``; else the last part of the path or
    URI (``s3://bucket/llama-7b/`` -> ``llama-7b``), or the model directory's name."""
    if model_id:
        if "://" not in model_id and not model_id.startswith(("/", ".", "~")):
            return model_id
        tail = model_id.rstrip("/").rsplit("/", 1)[-1]
        if tail:
            return tail
    return base_dir_name


class OpenAIApi:
    """The OpenAI routes of *app* (which owns the engine, the tokenizer and the errors)."""

    def __init__(self, app: LlmServerApp, names: tuple[str, ...]) -> None:
        self.app = app
        self.names = names
        self._token_texts: dict[int, str] = {}

    # --- checks ----------------------------------------------------------------------------

    def model(self, body: dict[str, Any]) -> str:
        """The served name *body* asks for (the first when it names none); 404 otherwise."""
        name = body.get("model")
        if name is None or name == "":
            return self.names[0]
        if name not in self.names:
            raise ParamError(404, f"The model `{name}` does not exist; this server serves "
                                  f"{', '.join(repr(n) for n in self.names)}", "model")
        return str(name)

    def _generating(self) -> None:
        loaded = self.app.loaded
        if loaded is not None and loaded.embedding:
            raise invalid("this model is an embedding model; it answers /v1/embeddings only")

    def _check_tokens(self, ids: list[int], field: str) -> None:
        vocab = self.app.vocab_size()
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise invalid(f"{field} holds token ids outside the vocabulary (0..{vocab - 1}): "
                          f"{bad[:5]}", field)

    def token_text(self, token: int) -> str:
        text = self._token_texts.get(token)
        if text is None:
            text = str(self.app.tokenizer().decode([token]))
            self._token_texts[token] = text
        return text

    # --- routes ----------------------------------------------------------------------------

    async def models(self, scope: Scope, receive: Receive, send: Send) -> int:
        limit = self.app.loaded.max_model_len if self.app.loaded else None
        created = int(time.time())
        await respond_json(send, {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "shoal",
             "root": self.names[0], "parent": None, "max_model_len": limit}
            for name in self.names]})
        return 200

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await self.app.json_body(scope, receive)
        model = self.model(body)
        self._generating()
        request = openai_request(body, chat=False, default_max_tokens=_COMPLETIONS_MAX_TOKENS)
        prompts = self._completion_prompts(body.get("prompt"))
        if request.echo and any(isinstance(p, list) for p in prompts):
            raise invalid("echo takes text prompts, not token ids", "echo")
        texts = [p if isinstance(p, str) else "" for p in prompts]
        ids = [self.app.encode(p, request.params) if isinstance(p, str)
               else self.app.check_length(p, request.params) for p in prompts]
        return await self._generate(texts, ids, request, body, receive, send, chat=False,
                                    model=model)

    def _completion_prompts(self, prompt: Any) -> list[str | list[int]]:
        """A string, a list of strings, a list of token ids or a list of such lists."""
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) and p for p in prompt):
                return list(prompt)
            if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                self._check_tokens(prompt, "prompt")
                return [list(prompt)]
            if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p)
                   for p in prompt):
                for p in prompt:
                    self._check_tokens(p, "prompt")
                return [list(p) for p in prompt]
        return [prompt_text(prompt, "prompt")]

    async def chat_completions(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await self.app.json_body(scope, receive)
        return await self.chat(body, receive, send, model=self.model(body))

    async def chat(self, body: dict[str, Any], receive: Receive, send: Send, *,
                   model: str | None = None) -> int:
        self._generating()
        _check_response_format(body.get("response_format"))
        prompt = self.chat_prompt(body, add_generation_prompt=True)
        room = self.app.max_len() - len(self.app.token_ids(prompt, chat=True))
        request = openai_request(body, chat=True, default_max_tokens=max(1, room))
        ids = self.app.encode(prompt, request.params, chat=True)
        return await self._generate([prompt], [ids], request, body, receive, send, chat=True,
                                    model=model or self.names[0])

    def chat_prompt(self, body: dict[str, Any], *, add_generation_prompt: bool,
                    continue_final_message: bool = False) -> str:
        """The chat template applied to the request's messages (and tools, when the template
        takes them and ``tool_choice`` is ``none``)."""
        tokenizer = self.app.tokenizer()
        messages = wire.chat_prompt_messages(body.get("messages"))
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise invalid("this model's tokenizer has no chat template; use /v1/completions "
                          "or /invocations with a plain prompt", "messages")
        extra: dict[str, Any] = {}
        tools = body.get("tools")
        if tools:
            extra["tools"] = _checked_tools(tools, body.get("tool_choice"), str(template))
        try:
            return str(tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **extra))
        except Exception as e:  # the template's own checks (roles, order) raise
            raise invalid(f"the chat template rejected the messages: {e}", "messages") from None

    # --- generation ------------------------------------------------------------------------

    async def _generate(self, prompts: list[str], ids: list[list[int]], request: OpenAIRequest,
                        body: dict[str, Any], receive: Receive, send: Send, *, chat: bool,
                        model: str) -> int:
        """``n`` generations per prompt (choice ``k * n + i``), whole or streamed."""
        jobs = [(prompts[k], ids[k], _nth(request.params, i))
                for k in range(len(prompts)) for i in range(request.n)]
        prompt_tokens = sum(len(i) for i in ids)
        if not flag(body, "stream"):
            outcomes = await self.app.run_all(jobs, receive)
            await respond_json(send, wire.openai_response(
                outcomes, chat=chat, model=model, prompt_tokens=prompt_tokens,
                logprobs=request.logprobs, token_text=self.token_text, echo=request.echo))
            return 200
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        ident = wire.openai_id(chat)
        async with self.app.streams(jobs, receive) as channels:
            await start(send, _SSE)
            if chat:
                await chunk(send, b"".join(
                    wire.openai_chunk(ident, chat=True, model=model, text="", first=True,
                                      index=i) for i in range(len(channels))))
            elif request.echo:
                await chunk(send, b"".join(
                    wire.openai_chunk(ident, chat=False, model=model, text=job[0], index=i)
                    for i, job in enumerate(jobs)))
            count = 0
            async for index, events in _merged(channels, send):
                count += len(events)
                pieces = [self._stream_chunk(ident, chat, model, index, e, request)
                          for e in events if e.text or e.finish is not None
                          or request.logprobs is not None]
                if pieces:
                    await chunk(send, b"".join(pieces))
            if include_usage:
                await chunk(send, wire.openai_chunk(ident, chat=chat, model=model, text=None,
                                                    usage_counts=wire.usage(prompt_tokens,
                                                                            count)))
            await chunk(send, b"data: [DONE]\n\n", more=False)
        return 200

    def _stream_chunk(self, ident: str, chat: bool, model: str, index: int, event: Any,
                      request: OpenAIRequest) -> bytes:
        logprobs: dict[str, Any] | None = None
        if request.logprobs is not None:
            if chat:
                logprobs = {"content": [wire.chat_logprob(event.token_id, event.logprob,
                                                          event.top, self.token_text)],
                            "refusal": None}
            else:
                logprobs = wire.completion_logprobs([event], self.token_text, 0)
        return wire.openai_chunk(ident, chat=chat, model=model, text=event.text,
                                 finish=event.finish, index=index, logprobs=logprobs)

    # --- vLLM's extra routes ---------------------------------------------------------------

    async def tokenize(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await self.app.json_body(scope, receive)
        self.model(body)
        tokenizer = self.app.tokenizer()
        if "messages" in body:
            prompt = self.chat_prompt(
                body, add_generation_prompt=flag(body, "add_generation_prompt")
                if "add_generation_prompt" in body else True,
                continue_final_message=flag(body, "continue_final_message"))
            special = flag(body, "add_special_tokens")
        else:
            prompt = prompt_text(body.get("prompt"), "prompt")
            special = flag(body, "add_special_tokens") if "add_special_tokens" in body \
                else True
        ids = list(tokenizer(prompt, add_special_tokens=special)["input_ids"])
        strs = tokenizer.convert_ids_to_tokens(ids) if flag(body, "return_token_strs") \
            else None
        await respond_json(send, {"count": len(ids), "max_model_len": self.app.max_len(),
                                  "tokens": ids, "token_strs": strs})
        return 200

    async def detokenize(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await self.app.json_body(scope, receive)
        self.model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise invalid(f"'tokens' must be a list of token ids, got {tokens!r}", "tokens")
        self._check_tokens(tokens, "tokens")
        await respond_json(send, {"prompt": str(self.app.tokenizer().decode(tokens))})
        return 200

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await self.app.json_body(scope, receive)
        model = self.model(body)
        loaded = self.app.loaded
        if loaded is None or not loaded.embedding:
            raise invalid("The model does not support Embeddings API (it is a generative "
                          "model; serve an embedding model for /v1/embeddings)", "model")
        inputs = self._embedding_inputs(body.get("input"))
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise invalid(f"encoding_format must be 'float' or 'base64', got {encoding!r}",
                          "encoding_format")
        if body.get("dimensions") is not None:
            raise invalid("dimensions is not supported by this model (no Matryoshka "
                          "embeddings)", "dimensions")
        engine: Any = loaded.engine
        vectors = await asyncio.get_running_loop().run_in_executor(None, engine.embed, inputs)
        data = [{"object": "embedding", "index": i,
                 "embedding": _base64(v) if encoding == "base64" else v}
                for i, v in enumerate(vectors)]
        tokens = sum(len(i) for i in inputs)
        await respond_json(send, {"id": f"embd-{uuid.uuid4().hex[:24]}", "object": "list",
                                  "created": int(time.time()), "model": model, "data": data,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
        return 200

    def _embedding_inputs(self, value: Any) -> list[list[int]]:
        items = self._completion_prompts(value)
        limit = self.app.max_len()
        out = []
        for item in items:
            ids = self.app.token_ids(item) if isinstance(item, str) else item
            if len(ids) > limit:
                raise invalid(f"an input has {len(ids)} tokens; this model takes at most "
                              f"{limit}", "input")
            out.append(ids)
        return out


def _nth(params: GenerationParams, i: int) -> GenerationParams:
    """The *i*-th choice's parameters: a given seed becomes ``seed + i`` (vLLM's children)."""
    if i == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + i)


async def _merged(channels: list[Channel], send: Send
                  ) -> AsyncIterator[tuple[int, list[TokenEvent]]]:
    """The events of every channel as ``(index, events)`` as they arrive."""
    if len(channels) == 1:
        async for events in guarded(channels[0], send):
            yield 0, events
        return
    iterators = [guarded(c, send).__aiter__() for c in channels]
    tasks = {asyncio.ensure_future(it.__anext__()): k for k, it in enumerate(iterators)}
    try:
        while tasks:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                k = tasks.pop(task)
                try:
                    events = task.result()
                except StopAsyncIteration:
                    continue
                yield k, events
                tasks[asyncio.ensure_future(iterators[k].__anext__())] = k
    finally:
        for task in tasks:
            task.cancel()


def _check_response_format(value: Any) -> None:
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return
    if kind in ("json_object", "json_schema"):
        raise invalid(f"response_format type {kind!r} needs guided decoding, which this "
                      f"server does not do; leave response_format out (or 'text')",
                      "response_format")
    raise invalid(f"response_format must be an object with type 'text', 'json_object' or "
                  f"'json_schema', got {value!r}", "response_format")


def _checked_tools(tools: Any, choice: Any, template: str) -> list[Any]:
    """*tools* for the chat template, as vLLM takes them without a tool-call parser: with
    ``tool_choice: "none"`` the template sees them and the answer is text; ``auto``
    (the default with tools), ``required`` or a named function need a parser: 400."""
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise invalid("tools must be a list of {type: function, function: {...}}", "tools")
    if choice is None:
        choice = "auto"
    if choice != "none":
        shown = choice if isinstance(choice, str) else "a named function"
        raise invalid(f"tool_choice {shown!r} needs a tool-call parser, which this server "
                      f"does not have; send tool_choice 'none' to give the tools to the chat "
                      f"template and get a text answer", "tool_choice")
    if "tools" not in template:
        raise invalid("this model's chat template does not take tools", "tools")
    return tools


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding: little-endian float32."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
