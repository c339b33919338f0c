"""JSON for shoal's own envelopes, out of reach of user code that changes the json module.

A job's code runs in shoal's process, and may replace ``json.JSONEncoder``, ``json.dumps``
or the encoder's methods (to teach json about its own types, say). The metadata shoal
writes after the function returns (the result's ``metadata.json``, the exception summary,
the warm executor's frames) must not go through what it changed. So this module loads its
own copy of the standard library's ``json.encoder`` and ``json.decoder`` from their source
files at import (before any user code runs), and encodes and decodes only with instances of
those private classes: nothing a job does to ``json`` reaches them.

Part of the job runtime (``envs/_runtime.py``): standard library only.
"""

from __future__ import annotations

import importlib.util
import json.decoder
import json.encoder
from types import ModuleType
from typing import Any

__all__ = ["dumps", "loads"]


def _private_copy(module: ModuleType) -> ModuleType:
    """A fresh, unshared module from *module*'s source file (itself where it has none)."""
    origin = getattr(module, "__file__", None)
    suffix = module.__name__.rpartition(".")[2]
    spec = importlib.util.spec_from_file_location(f"shoal._internal._json_{suffix}", origin
                                                  ) if origin else None
    if spec is None or spec.loader is None:  # a frozen or zipped standard library
        return module
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


_encoder_module = _private_copy(json.encoder)
_decoder_module = _private_copy(json.decoder)
_SORTED = _encoder_module.JSONEncoder(sort_keys=True)
_PLAIN = _encoder_module.JSONEncoder()
_DECODER = _decoder_module.JSONDecoder()
_encode_sorted, _encode_plain, _decode = _SORTED.encode, _PLAIN.encode, _DECODER.decode


def dumps(obj: Any, *, sort_keys: bool = False) -> str:
    """``json.dumps(obj, sort_keys=...)`` with shoal's private encoder."""
    return str(_encode_sorted(obj) if sort_keys else _encode_plain(obj))


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)`` with shoal's private decoder (bytes must be UTF-8)."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    return _decode(text)
