"""SageMaker's tags: ``[{"Key": ..., "Value": ...}]``, a mapping, or (key, value) pairs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shoal.errors import InvalidArgumentError

__all__ = ["normalise_tags", "parse_tag"]


def normalise_tags(tags: Any) -> list[tuple[str, str]]:
    if not tags:
        return []
    out = []
    if isinstance(tags, Mapping):
        return [(str(k), str(v)) for k, v in tags.items()]
    if not isinstance(tags, Sequence):
        raise InvalidArgumentError('tags must be a list of {"Key": ..., "Value": ...}')
    for t in tags:
        if isinstance(t, Mapping) and "Key" in t and "Value" in t:
            out.append((str(t["Key"]), str(t["Value"])))
        elif isinstance(t, tuple | list) and len(t) == 2:
            out.append((str(t[0]), str(t[1])))
        else:
            raise InvalidArgumentError(f'tag {t!r} must be {{"Key": ..., "Value": ...}}')
    return out


def parse_tag(text: str) -> tuple[str, str]:
    """``key=value`` as a tag (the value may hold ``=``; split at the first); a filter's."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InvalidArgumentError(f"tag filter {text!r} must be key=value (e.g. team=vision)",
                                   tag=text)
    return key, value
