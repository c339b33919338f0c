"""Which environment variables hold secrets, and how they are shown: ``****``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MASK", "is_secret_name", "mask_env", "secret_values"]

MASK = "****"
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")


def is_secret_name(name: str) -> bool:
    """True for environment variable names that look like they hold a secret."""
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS)


def mask_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """*env* with the values of secret-looking names replaced by ``****``."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str], *, min_length: int = 4) -> tuple[str, ...]:
    """Values to redact from logs: those of secret-looking names, longest first."""
    found: Iterable[str] = (v for k, v in env.items() if is_secret_name(k) and len(v) >= min_length)
    return tuple(sorted(set(found), key=len, reverse=True))
