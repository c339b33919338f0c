"""Jobs: the service that owns job state, the supervisor, slots and logs.

Names load lazily: the in-job entry point lives here and must import almost nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["JobService", "log_key"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shoal.jobs import service

        return getattr(service, name)
    raise AttributeError(f"module 'shoal.jobs' has no attribute {name!r}")
