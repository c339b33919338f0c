"""How job records look on the terminal and in ``--json``: colours, durations, masking."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import RenderableType
    from rich.table import Table
    from rich.text import Text

    from shoal.core.jobs import JobRecord

from shoal.core.secrets import MASK, is_secret_name, mask_env

__all__ = [
    "MASK",
    "STATUS_STYLES",
    "elapsed_seconds",
    "format_duration",
    "format_time",
    "iso",
    "is_secret_name",
    "listing",
    "mask_env",
    "parse_since",
    "print_json",
    "record_json",
    "shorten",
    "status_text",
]

STATUS_STYLES = {
    "pending": "dim",
    "starting": "cyan",
    "running": "blue",
    "stopping": "magenta",
    "completed": "green",
    "failed": "bold red",
    "stopped": "yellow",
}
_SINCE = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str) -> timedelta:
    """``30s``, ``30m``, ``2h``, ``1d`` or ``1w`` as a timedelta; ValueError otherwise."""
    match = _SINCE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration; use a number and a unit, such as "
                         "30m, 2h or 1d (units: s, m, h, d, w)")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def format_time(at: datetime | None) -> str:
    """Local time, to the second ('-' when unknown)."""
    if at is None:
        return "-"
    return at.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def elapsed_seconds(record: JobRecord) -> float | None:
    """How long the job has run: to its end, or to now while it is still running.

    (``JobRecord.duration_seconds`` stops at ``updated_at`` for an unfinished job, which is
    when it started running, so a running job would show about 0 s.)
    """
    if record.started_at is None:
        return None
    if record.is_terminal:
        return record.duration_seconds
    return (datetime.now(UTC) - record.started_at).total_seconds()


def shorten(text: str | None, width: int = 60) -> str:
    """The first line of *text*, cut to *width* characters with an ellipsis."""
    if not text:
        return ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if len(first) > width or "\n" in text.strip():
        first = first[: width - 1].rstrip() + "…"
    return first


def status_text(status: str) -> Text:
    from rich.text import Text

    return Text(str(status), style=STATUS_STYLES.get(str(status), ""))


def iso(at: datetime | None) -> str | None:
    """ISO 8601 with its UTC offset, or None (every time in ``--json``)."""
    return None if at is None else at.isoformat()


_iso = iso


def record_json(record: JobRecord, *, log_uri: str | None = None) -> dict[str, Any]:
    """Every field of *record* as JSON-ready data, secret-looking env values masked."""
    spec = record.spec.to_json()
    spec["environment_variables"] = mask_env(record.spec.environment_variables)
    data: dict[str, Any] = {
        "name": record.name,
        "status": str(record.status),
        "owner": record.owner,
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "started_at": _iso(record.started_at),
        "ended_at": _iso(record.ended_at),
        "duration_seconds": elapsed_seconds(record),
        "attempt": record.attempt,
        "failure_kind": None if record.failure_kind is None else str(record.failure_kind),
        "failure_reason": record.failure_reason,
        "exit_code": record.exit_code,
        "backend": record.backend,
        "handle": dict(record.handle),
        "env_setup_seconds": record.env_setup_seconds,
        "spec": spec,
        "events": [{"status": str(e.status), "at": _iso(e.at), "reason": e.reason}
                   for e in record.events],
    }
    if log_uri is not None:
        data["log_uri"] = log_uri
    return data


def listing(*columns: str, right: tuple[str, ...] = (), wrap: tuple[str, ...] = ()) -> Table:
    """The one table style of every listing: no box, bold upper-case headers, no padding at
    the edges. Columns named in *right* are right-aligned; only those in *wrap* may wrap."""
    from rich.table import Table

    t = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        t.add_column(column.upper(), no_wrap=column not in wrap,
                     justify="right" if column in right else "left")
    return t


def print_json(data: object) -> None:
    """``--json`` output: indented, keys in the order the command built them, one document."""
    import json
    import sys

    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def key_values(rows: Sequence[tuple[str, RenderableType]], *, title: str | None = None
               ) -> Table:
    """A two-column grid: dim key, value."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.title = title
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column()
    for key, value in rows:
        grid.add_row(key, value)
    return grid
