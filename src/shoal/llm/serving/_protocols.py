"""The wire shapes of the three APIs: DJL LMI (``/invocations``), TGI (``/generate``,
``/generate_stream``) and OpenAI (``/v1/completions``, ``/v1/chat/completions``), built from
the engine's ``TokenEvent``s. Pure functions: no I/O."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shoal.llm.serving._engine import FinishReason, TokenEvent
from shoal.llm.serving._params import GenerationParams, invalid

__all__ = ["Outcome", "chat_prompt_messages", "dumps", "lmi_details", "lmi_line", "openai_chunk",
           "openai_response", "sse", "tgi_details", "tgi_stream_event"]


@dataclass(slots=True)
class Outcome:
    """A finished generation, gathered from its events."""

    prompt: str
    prompt_tokens: int
    params: GenerationParams
    seed: int | None = None
    text: str = ""
    finish: FinishReason | None = None
    tokens: list[TokenEvent] = field(default_factory=list)

    def add(self, event: TokenEvent) -> None:
        self.tokens.append(event)
        if event.finish is not None:
            self.finish = event.finish
            self.text = event.generated_text or ""

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    @property
    def full_text(self) -> str:
        return self.prompt + self.text if self.params.return_full_text else self.text


def _json_dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _dumps_function() -> Callable[[Any], bytes]:
    """orjson's ``dumps`` when installed (the server's fast JSON path; several times faster
    on the small objects of a token stream), else compact ``json.dumps``."""
    try:
        import orjson
    except ImportError:
        return _json_dumps
    return orjson.dumps


#: compact JSON of *payload* as UTF-8 bytes
dumps = _dumps_function()


def sse(payload: Any) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


# --- LMI ------------------------------------------------------------------------------------

def lmi_token(e: TokenEvent) -> dict[str, Any]:
    return {"id": e.token_id, "text": e.text, "log_prob": e.logprob, "special": e.special}


def lmi_details(o: Outcome) -> dict[str, Any]:
    return {"finish_reason": o.finish.value if o.finish else None,
            "generated_tokens": o.completion_tokens, "inputs": o.prompt, "seed": o.seed,
            "tokens": [lmi_token(e) for e in o.tokens]}


def lmi_line(e: TokenEvent, o: Outcome) -> bytes:
    """One JSON line of an LMI stream; the last carries ``generated_text`` (and details)."""
    last = e.finish is not None
    body = {"token": lmi_token(e), "generated_text": o.full_text if last else None,
            "details": ({"finish_reason": e.finish.value if e.finish else None,
                         "generated_tokens": o.completion_tokens, "inputs": o.prompt}
                        if last and o.params.details else None)}
    return dumps(body) + b"\n"


# --- TGI ------------------------------------------------------------------------------------

def tgi_token(e: TokenEvent) -> dict[str, Any]:
    return {"id": e.token_id, "text": e.text, "logprob": e.logprob, "special": e.special}


def tgi_details(o: Outcome) -> dict[str, Any]:
    return {"finish_reason": o.finish.value if o.finish else None,
            "generated_tokens": o.completion_tokens, "seed": o.seed, "prefill": [],
            "tokens": [tgi_token(e) for e in o.tokens]}


def tgi_stream_event(e: TokenEvent, o: Outcome, index: int) -> bytes:
    last = e.finish is not None
    details = ({"finish_reason": e.finish.value if e.finish else None,
                "generated_tokens": o.completion_tokens, "seed": o.seed}
               if last and o.params.details else None)
    return sse({"index": index, "token": tgi_token(e), "top_tokens": None,
                "generated_text": o.full_text if last else None, "details": details})


# --- OpenAI ---------------------------------------------------------------------------------

def openai_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def finish_reason(finish: FinishReason | None) -> str | None:
    if finish is None:
        return None
    return "length" if finish is FinishReason.LENGTH else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


#: the token id -> its text (a single token decoded alone)
TokenText = Callable[[int], str]


def chat_logprob(token: int, logprob: float, top: list[tuple[int, float]] | None,
                 text: TokenText) -> dict[str, Any]:
    """One entry of a chat answer's ``logprobs.content``."""
    def entry(t: int, lp: float) -> dict[str, Any]:
        s = text(t)
        return {"token": s, "logprob": max(lp, -9999.0), "bytes": list(s.encode())}

    out = entry(token, logprob)
    out["top_logprobs"] = [entry(t, lp) for t, lp in top or ()]
    return out


def completion_logprobs(events: list[TokenEvent], text: TokenText, offset: int
                        ) -> dict[str, Any]:
    """A completion's ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs`` with the
    chosen token among the alternatives, ``text_offset`` from *offset*), as vLLM writes it."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for e in events:
        s = text(e.token_id)
        tokens.append(s)
        logprobs.append(max(e.logprob, -9999.0))
        top = {s: max(e.logprob, -9999.0)}
        for t, lp in e.top or ():
            top.setdefault(text(t), max(lp, -9999.0))
        tops.append(top)
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
            "text_offset": offsets}


def openai_response(outcomes: list[Outcome], *, chat: bool, model: str, prompt_tokens: int,
                    logprobs: int | None = None, token_text: TokenText | None = None,
                    echo: bool = False) -> dict[str, Any]:
    """A whole completion (``text_completion``) or chat answer (``chat.completion``); the
    choices are *outcomes* in order."""
    choices: list[dict[str, Any]] = []
    for i, o in enumerate(outcomes):
        choice: dict[str, Any] = {"index": i, "finish_reason": finish_reason(o.finish),
                                  "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": o.text}
            if logprobs is not None and token_text is not None:
                choice["logprobs"] = {"content": [chat_logprob(e.token_id, e.logprob, e.top,
                                                               token_text)
                                                  for e in o.tokens], "refusal": None}
        else:
            choice["text"] = o.prompt + o.text if echo else o.text
            if logprobs is not None and token_text is not None:
                choice["logprobs"] = completion_logprobs(o.tokens, token_text,
                                                         len(o.prompt) if echo else 0)
        choices.append(choice)
    return {"id": openai_id(chat), "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(prompt_tokens, sum(o.completion_tokens for o in outcomes))}


def openai_chunk(ident: str, *, chat: bool, model: str, text: str | None,
                 finish: FinishReason | None = None, first: bool = False,
                 usage_counts: dict[str, int] | None = None, index: int = 0,
                 logprobs: dict[str, Any] | None = None) -> bytes:
    """One SSE chunk of choice *index*; ``text`` None with ``usage_counts`` is the closing
    usage chunk."""
    body: dict[str, Any] = {"id": ident,
                            "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": int(time.time()), "model": model}
    if usage_counts is not None and text is None:
        body["choices"] = []
        body["usage"] = usage_counts
        return sse(body)
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if first \
            else ({"content": text} if text else {})
        choice: dict[str, Any] = {"index": index, "delta": delta}
    else:
        choice = {"index": index, "text": text or ""}
    choice["finish_reason"] = finish_reason(finish)
    choice["logprobs"] = logprobs
    body["choices"] = [choice]
    return sse(body)


def chat_prompt_messages(messages: Any) -> list[dict[str, str]]:
    """OpenAI ``messages`` as ``{"role", "content"}`` with text content (parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list of {role, content} objects")
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise invalid(f"messages[{i}] must be an object with a 'role'")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"):
                    raise invalid(f"messages[{i}]: only text content parts are supported")
                parts.append(str(part.get("text", "")))
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise invalid(f"messages[{i}].content must be a string or a list of text parts")
        out.append({"role": m["role"], "content": content})
    return out
