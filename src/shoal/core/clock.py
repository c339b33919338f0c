"""Injected time and identifiers, so tests control both."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Protocol

from shoal.core.jobs import JobName

__all__ = ["Clock", "IdFactory", "SystemClock", "job_name_for"]


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class IdFactory(Protocol):
    def job_name(self, base: str, now: datetime) -> JobName: ...


_BAD = re.compile(r"[^A-Za-z0-9]+")


def job_name_for(base: str, now: datetime, suffix: str) -> JobName:
    """``<base>-<yymmdd-hhmmss>-<suffix>``, at most 63 characters, like SageMaker's names."""
    stamp = now.strftime("%y%m%d-%H%M%S")
    # Runs of anything else (hyphens included) become one hyphen; cut, then trim the ends.
    clean = _BAD.sub("-", base).lower()[: 63 - len(stamp) - len(suffix) - 2].strip("-")
    return JobName(f"{clean or 'job'}-{stamp}-{suffix}")


class RandomIdFactory:
    def job_name(self, base: str, now: datetime) -> JobName:
        return job_name_for(base, now, secrets.token_hex(3))
