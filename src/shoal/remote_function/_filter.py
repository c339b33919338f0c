"""CustomFileFilter: which files of the working directory a job takes along (SageMaker's)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CustomFileFilter"]


class CustomFileFilter:
    """Ignore-name patterns for ``include_local_workdir`` (shipping the workdir is TODO(#3))."""

    def __init__(self, *, ignore_name_patterns: Sequence[str] = ()) -> None:
        self._patterns = tuple(ignore_name_patterns)

    @property
    def ignore_name_patterns(self) -> tuple[str, ...]:
        return self._patterns

    def __repr__(self) -> str:
        return f"CustomFileFilter(ignore_name_patterns={list(self._patterns)!r})"
