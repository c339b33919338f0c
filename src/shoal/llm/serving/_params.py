"""Generation parameters: the LMI/TGI ``parameters`` object and OpenAI's request fields,
validated into one frozen ``GenerationParams``; a bad value is a 422 naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.serving._http import RequestError

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "GenerationParams", "from_lmi", "from_openai",
           "invalid"]

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

    @property
    def plain_greedy(self) -> bool:
        """Greedy on the raw logits: the batch's argmax is the answer."""
        return not self.do_sample and self.repetition_penalty == 1.0


def invalid(detail: str) -> RequestError:
    """422, TGI's status for a request that parses but cannot be served as asked."""
    return RequestError(422, "validation", detail)


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


#: OpenAI fields this server reads; others that change the answer are refused.
OPENAI_FIELDS = frozenset({"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                           "temperature", "top_p", "top_k", "stop", "seed", "stream",
                           "stream_options", "n", "user", "echo", "logprobs", "top_logprobs",
                           "frequency_penalty", "presence_penalty", "repetition_penalty",
                           "logit_bias", "suffix", "best_of", "response_format", "tools",
                           "tool_choice", "parallel_tool_calls", "metadata", "store",
                           "service_tier"})


def from_openai(body: Mapping[str, Any], *, default_max_tokens: int) -> GenerationParams:
    """``GenerationParams`` from an OpenAI completions or chat request. As OpenAI does, the
    temperature defaults to 1 (sampling); ``temperature`` 0 is greedy."""
    given = {k: v for k, v in body.items() if v is not None}
    unknown = sorted(k for k in given if k not in OPENAI_FIELDS)
    if unknown:
        raise invalid(f"unknown field(s) {unknown}")
    for name, neutral in (("n", (1,)), ("best_of", (1,)), ("logprobs", (False, 0)),
                          ("echo", (False,)), ("frequency_penalty", (0, 0.0)),
                          ("presence_penalty", (0, 0.0)), ("logit_bias", ()),
                          ("suffix", ()), ("tools", ()), ("top_logprobs", (0,))):
        if name in given and given[name] not in neutral and given[name] not in ({}, []):
            raise invalid(f"{name}={given[name]!r} is not supported by this server")
    if "max_completion_tokens" in given:
        max_tokens = _integer(given, "max_completion_tokens", default_max_tokens, minimum=1)
    else:
        max_tokens = _integer(given, "max_tokens", default_max_tokens, minimum=1)
    temperature = _number(given, "temperature", 1.0, minimum=0.0, maximum=2.0)
    return GenerationParams(
        max_new_tokens=max_tokens, do_sample=temperature > 0.0, temperature=temperature,
        top_p=_number(given, "top_p", 1.0, minimum=0.0, inclusive_min=False, maximum=1.0),
        top_k=_integer(given, "top_k", 0, minimum=0),
        repetition_penalty=_number(given, "repetition_penalty", 1.0, minimum=0.0,
                                   inclusive_min=False),
        stop=_stop(given.get("stop"), "stop"), seed=_seed(given))


def _boolean(given: Mapping[str, Any], name: str, default: bool) -> bool:
    value = given.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise invalid(f"{name} must be true or false, got {value!r}")


def _integer(given: Mapping[str, Any], name: str, default: int, *, minimum: int) -> int:
    value = given.get(name, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise invalid(f"{name} must be >= {minimum}, got {value}")
    return value


def _number(given: Mapping[str, Any], name: str, default: float, *, minimum: float,
            inclusive_min: bool = True, maximum: float | None = None) -> float:
    value = given.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(f"{name} must be a number, got {value!r}")
    low_ok = value >= minimum if inclusive_min else value > minimum
    if not low_ok or (maximum is not None and value > maximum):
        low = f"{'>=' if inclusive_min else '>'} {minimum:g}"
        bound = low if maximum is None else f"{low} and <= {maximum:g}"
        raise invalid(f"{name} must be {bound}, got {value}")
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
        raise invalid(f"{name} must be a string or a list of non-empty strings, got {value!r}")
    return tuple(items)
