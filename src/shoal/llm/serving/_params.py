"""Generation parameters: the LMI/TGI ``parameters`` object and OpenAI's request fields,
validated into one frozen ``GenerationParams``; a bad value is a 422 naming it (the OpenAI
routes answer it as 400, as vLLM does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.serving.http import RequestError

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "GenerationParams", "OpenAIRequest", "ParamError",
           "from_lmi", "from_openai", "invalid", "openai_request"]

#: DJL LMI's default when a request names no ``max_new_tokens``.
DEFAULT_MAX_NEW_TOKENS = 30

#: The LMI/TGI parameters this server honours.
LMI_PARAMETERS = frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "do_sample",
                            "repetition_penalty", "stop", "stop_sequences", "seed",
                            "return_full_text", "details"})
#: TGI parameters clients send with a neutral value (huggingface_hub's InferenceClient does):
#: accepted when neutral, refused otherwise.
_NEUTRAL = {"decoder_input_details": (False,), "watermark": (False,), "best_of": (1,),
            "typical_p": (1.0,), "truncate": (), "top_n_tokens": (0,), "grammar": (),
            "adapter_id": (), "frequency_penalty": (0.0, 0), "presence_penalty": (0.0, 0)}


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """How one sequence is generated. ``do_sample`` False is greedy (``temperature`` and the
    filters are then unused)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    return_full_text: bool = False
    details: bool = False
    #: OpenAI's penalties on the generated tokens: ``presence`` once a token occurs,
    #: ``frequency`` times its count (vLLM's semantics; the prompt is not counted)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: (token id, bias added to its logit) pairs
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: how many of the likeliest tokens (with log-probabilities) each token event carries
    top_logprobs: int = 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy on the raw logits: the batch's argmax is the answer."""
        return not self.do_sample and not self.adjusts_logits

    @property
    def adjusts_logits(self) -> bool:
        """Whether a penalty or a bias changes the logits before the choice."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0 or bool(self.logit_bias))


class ParamError(RequestError):
    """A request field that cannot be served as given; ``param`` names it (OpenAI's error
    object carries it)."""

    def __init__(self, status: int, detail: str, param: str | None = None) -> None:
        super().__init__(status, "validation", detail)
        self.param = param


def invalid(detail: str, param: str | None = None) -> RequestError:
    """422, TGI's status for a request that parses but cannot be served as asked (the OpenAI
    routes answer 400)."""
    return ParamError(422, detail, param)


def from_lmi(parameters: Any, *, full_text: bool = False) -> GenerationParams:
    """``GenerationParams`` from an LMI/TGI ``parameters`` object; *full_text* is the default
    of ``return_full_text``.

    Sampling is on with ``do_sample`` (``true``/``"True"``), or, as in TGI, when a temperature
    other than 1, a ``top_k`` above 0 or a ``top_p`` below 1 is given; ``temperature`` 0 is
    greedy. Unknown names are refused with the list of known ones.
    """
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, Mapping):
        raise invalid(f"'parameters' must be an object, got {type(parameters).__name__}")
    given = {k: v for k, v in parameters.items() if v is not None}
    unknown = sorted(k for k in given if k not in LMI_PARAMETERS
                     and not (k in _NEUTRAL and (given[k] in _NEUTRAL[k] or given[k] == [])))
    if unknown:
        raise invalid(f"unknown or unsupported parameter(s) {unknown}; this server takes "
                      f"{sorted(LMI_PARAMETERS)}")
    temperature = _number(given, "temperature", 1.0, minimum=0.0)
    top_p = _number(given, "top_p", 1.0, minimum=0.0, inclusive_min=False, maximum=1.0)
    top_k = _integer(given, "top_k", 0, minimum=0)
    do_sample = _boolean(given, "do_sample", False)
    if "do_sample" not in given:
        do_sample = temperature != 1.0 or top_k > 0 or top_p < 1.0
    if temperature == 0.0:
        do_sample = False
    stop = _stop(given.get("stop"), "stop") + _stop(given.get("stop_sequences"),
                                                     "stop_sequences")
    return GenerationParams(
        max_new_tokens=_integer(given, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS, minimum=1),
        do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k,
        repetition_penalty=_number(given, "repetition_penalty", 1.0, minimum=0.0,
                                   inclusive_min=False),
        stop=stop, seed=_seed(given),
        return_full_text=_boolean(given, "return_full_text", full_text),
        details=_boolean(given, "details", False))


#: OpenAI fields this server reads; others are refused.
OPENAI_FIELDS = frozenset({"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                           "temperature", "top_p", "top_k", "stop", "seed", "stream",
                           "stream_options", "n", "user", "echo", "logprobs", "top_logprobs",
                           "frequency_penalty", "presence_penalty", "repetition_penalty",
                           "logit_bias", "suffix", "best_of", "response_format", "tools",
                           "tool_choice", "parallel_tool_calls", "metadata", "store",
                           "service_tier"})
#: The most alternatives a token's ``top_logprobs`` may ask for (vLLM's default max_logprobs).
MAX_LOGPROBS = 20
#: The most choices one request may ask for.
MAX_N = 128


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    """An OpenAI completions or chat request's generation fields. ``logprobs``: None, or how
    many alternatives each token reports (0: the chosen token's only)."""

    params: GenerationParams
    n: int = 1
    logprobs: int | None = None
    echo: bool = False


def openai_request(body: Mapping[str, Any], *, chat: bool, default_max_tokens: int
                   ) -> OpenAIRequest:
    """The generation fields of an OpenAI request, as vLLM reads them: chat takes
    ``logprobs: true`` with ``top_logprobs: k``, completions ``logprobs: k``; a field this
    server cannot honour is refused naming it."""
    given = {k: v for k, v in body.items() if v is not None}
    unknown = sorted(k for k in given if k not in OPENAI_FIELDS)
    if unknown:
        raise invalid(f"unknown field(s) {unknown}", unknown[0])
    for name, neutral in (("best_of", (1,)), ("suffix", ("",))):
        if name in given and given[name] not in neutral:
            raise invalid(f"{name}={given[name]!r} is not supported by this server", name)
    if chat:
        logprobs = (_integer(given, "top_logprobs", 0, minimum=0, maximum=MAX_LOGPROBS)
                    if _boolean(given, "logprobs", False) else None)
        if logprobs is None and given.get("top_logprobs"):
            raise invalid("top_logprobs needs logprobs=true", "top_logprobs")
        echo = False
        if "echo" in given:
            raise invalid("echo is a /v1/completions field", "echo")
    else:
        logprobs = (_integer(given, "logprobs", 0, minimum=0, maximum=MAX_LOGPROBS)
                    if "logprobs" in given and given["logprobs"] is not False else None)
        echo = _boolean(given, "echo", False)
        if echo and logprobs is not None:
            raise invalid("echo with logprobs (the prompt's log-probabilities) is not "
                          "supported by this server; drop one of them", "echo")
    params = from_openai(given, default_max_tokens=default_max_tokens,
                         top_logprobs=logprobs or 0)
    return OpenAIRequest(params, n=_integer(given, "n", 1, minimum=1, maximum=MAX_N),
                         logprobs=logprobs, echo=echo)


def from_openai(body: Mapping[str, Any], *, default_max_tokens: int,
                top_logprobs: int = 0) -> GenerationParams:
    """``GenerationParams`` from an OpenAI completions or chat request. As OpenAI does, the
    temperature defaults to 1 (sampling); ``temperature`` 0 is greedy."""
    given = {k: v for k, v in body.items() if v is not None}
    if "max_completion_tokens" in given:
        max_tokens = _integer(given, "max_completion_tokens", default_max_tokens, minimum=1)
    else:
        max_tokens = _integer(given, "max_tokens", default_max_tokens, minimum=1)
    temperature = _number(given, "temperature", 1.0, minimum=0.0, maximum=2.0)
    return GenerationParams(
        max_new_tokens=max_tokens, do_sample=temperature > 0.0, temperature=temperature,
        top_p=_number(given, "top_p", 1.0, minimum=0.0, inclusive_min=False, maximum=1.0),
        top_k=_integer(given, "top_k", 0, minimum=-1) if given.get("top_k") != -1 else 0,
        repetition_penalty=_number(given, "repetition_penalty", 1.0, minimum=0.0,
                                   inclusive_min=False),
        presence_penalty=_number(given, "presence_penalty", 0.0, minimum=-2.0, maximum=2.0),
        frequency_penalty=_number(given, "frequency_penalty", 0.0, minimum=-2.0, maximum=2.0),
        logit_bias=_logit_bias(given.get("logit_bias")), top_logprobs=top_logprobs,
        stop=_stop(given.get("stop"), "stop"), seed=_seed(given))


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` (bias in [-100, 100]) as sorted pairs."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise invalid(f"logit_bias must be an object of token id -> bias, got {value!r}",
                      "logit_bias")
    pairs: list[tuple[int, float]] = []
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise invalid(f"logit_bias keys must be token ids, got {key!r}",
                          "logit_bias") from None
        if isinstance(bias, bool) or not isinstance(bias, int | float) \
                or not -100 <= bias <= 100:
            raise invalid(f"logit_bias[{key!r}] must be a number in [-100, 100], got {bias!r}",
                          "logit_bias")
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


def _boolean(given: Mapping[str, Any], name: str, default: bool) -> bool:
    value = given.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise invalid(f"{name} must be true or false, got {value!r}")


def _integer(given: Mapping[str, Any], name: str, default: int, *, minimum: int,
             maximum: int | None = None) -> int:
    value = given.get(name, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be an integer, got {value!r}", name)
    if value < minimum:
        raise invalid(f"{name} must be >= {minimum}, got {value}", name)
    if maximum is not None and value > maximum:
        raise invalid(f"{name} must be <= {maximum}, got {value}", name)
    return value


def _number(given: Mapping[str, Any], name: str, default: float, *, minimum: float,
            inclusive_min: bool = True, maximum: float | None = None) -> float:
    value = given.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(f"{name} must be a number, got {value!r}", name)
    low_ok = value >= minimum if inclusive_min else value > minimum
    if not low_ok or (maximum is not None and value > maximum):
        low = f"{'>=' if inclusive_min else '>'} {minimum:g}"
        bound = low if maximum is None else f"{low} and <= {maximum:g}"
        raise invalid(f"{name} must be {bound}, got {value}", name)
    return float(value)


def _seed(given: Mapping[str, Any]) -> int | None:
    if "seed" not in given:
        return None
    return _integer(given, "seed", 0, minimum=0)


def _stop(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise invalid(f"{name} must be a string or a list of non-empty strings, got {value!r}",
                      name)
    return tuple(items)
