"""Which environment variables hold secrets, and how they are shown: ``****``.

Standard library only: a job's own interpreter imports it (``envs/_runtime.py`` copies it);
``shoal.core.secrets`` is its public name.

``StreamRedactor`` masks secret values in a byte stream that arrives in pieces (a job's
output): a value split across two writes, reads or lines is still masked, because the bytes
that could begin a secret are held back until the next piece (or the end) decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["JOB_SECRETS_VAR", "MASK", "StreamRedactor", "is_secret_name", "mask_env", "mask_text", "secret_values",
           "without_credentials"]

MASK = "****"
#: The variable of a supervisor's environment that hands it the secrets of its jobs (JSON,
#: job name -> hex; ``shoal.jobs.keys``). It never reaches a job's own process.
JOB_SECRETS_VAR = "SHOAL_JOB_SECRETS"
_URL_WITH_PASSWORD = re.compile(r"://[^/@\s:]*:[^/@\s]+@")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")


def is_secret_name(name: str) -> bool:
    """True for environment variable names that look like they hold a secret."""
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS)


#: Variables that hand a process a store's or a cloud's credentials by name or by file.
_CREDENTIAL_PREFIXES = ("AWS_", "PG", "AZURE_", "GOOGLE_", "GCS_", "BOTO_")


def without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """*env* without what would hand a process another's credentials: secret-looking names,
    cloud and PostgreSQL client variables (``AWS_*``, ``PG*``, ``AZURE_*``, ``GOOGLE_*``...)
    and any value holding a URL with a password (``postgresql://u:pw@host/db``)."""
    return {k: v for k, v in env.items()
            if not is_secret_name(k) and not k.upper().startswith(_CREDENTIAL_PREFIXES)
            and not _URL_WITH_PASSWORD.search(v)}


def mask_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """*env* with the values of secret-looking names replaced by ``****``."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str], *, min_length: int = 4) -> tuple[str, ...]:
    """Values to redact from logs: those of secret-looking names, longest first."""
    found: Iterable[str] = (v for k, v in env.items() if is_secret_name(k) and len(v) >= min_length)
    return tuple(sorted(set(found), key=len, reverse=True))


def mask_text(text: str, values: Iterable[str]) -> str:
    """*text* with every occurrence of each of *values* (longest first) replaced by ``****``."""
    for value in sorted({v for v in values if v}, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text


class StreamRedactor:
    """Masks *values* in a stream of byte chunks: ``feed`` returns what is safe to pass on,
    ``flush`` the rest at the end of the stream.

    A chunk's last bytes are held back while they could be the start of a value (at most the
    longest value's length minus one), so a value written in pieces never passes whole.
    """

    def __init__(self, values: Iterable[str]) -> None:
        encoded = {v.encode() for v in values if v}
        self._values = tuple(sorted(encoded, key=len, reverse=True))
        self._held = b""

    @property
    def active(self) -> bool:
        return bool(self._values)

    def feed(self, data: bytes) -> bytes:
        if not self._values:
            return data
        data = self._mask(self._held + data)
        keep = self._prefix_at_end(data)
        self._held = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep] if keep else data

    def flush(self) -> bytes:
        """What is held back, masked (the stream has ended)."""
        held, self._held = self._held, b""
        return self._mask(held)

    def _mask(self, data: bytes) -> bytes:
        for value in self._values:
            if value in data:
                data = data.replace(value, MASK.encode())
        return data

    def _prefix_at_end(self, data: bytes) -> int:
        """The length of the longest end of *data* that begins some value (0 if none)."""
        best = 0
        for value in self._values:
            for k in range(min(len(value) - 1, len(data)), best, -1):
                if data.endswith(value[:k]):
                    best = k
                    break
        return best
