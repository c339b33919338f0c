"""``shoal envs list|prune``: the job environments built with uv and cached under the home."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from shoal.cli._context import emit, err, out, state
from shoal.cli._render import listing, print_json

if TYPE_CHECKING:
    from shoal.envs import UvEnvBuilder

__all__ = ["app"]

app = typer.Typer(help="List and prune cached job environments.", no_args_is_help=True,
                  rich_markup_mode=None)


def _builder(command: str) -> UvEnvBuilder:
    from shoal.cli._remote import refuse_through_server
    from shoal.session import Session

    refuse_through_server(command)
    builder: UvEnvBuilder = Session(**state.session_kwargs()).env_builder
    return builder


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


@app.command("list")
def list_envs(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show every cached environment: key, packages, size, last use."""
    envs = _builder("envs list").list()
    if as_json:
        print_json([{"key": e.key, "packages": e.packages, "size_bytes": e.size_bytes,
                     "created_at": _iso(e.created_at), "last_used_at": _iso(e.last_used_at),
                     "path": str(e.path)} for e in envs])
        return
    if not envs:
        err().print("no cached environments")
        return
    table = listing("key", "packages", "size", "created", "last used", "path",
                    right=("packages", "size"))
    now = time.time()
    for e in envs:
        table.add_row(e.key[:16], str(e.packages), _size(e.size_bytes), _age(now - e.created_at),
                      _age(now - e.last_used_at), str(e.path))
    emit(table)


def _iso(timestamp: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, UTC).isoformat()


@app.command()
def prune(
    unused_for: Annotated[str, typer.Option(
        "--unused-for", help="Remove environments unused for this long (30m, 2h, 7d); 0 removes "
                             "all.")] = "7d",
) -> None:
    """Remove environments not used recently (and leftovers of failed builds)."""
    seconds = _parse_duration(unused_for)
    removed = _builder("envs prune").prune(unused_for_seconds=seconds)
    out().print(f"removed {len(removed)} environment(s)"
                + (": " + ", ".join(k[:16] for k in removed) if removed else ""))


def _parse_duration(text: str) -> float:
    from shoal.errors import InvalidArgumentError

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = text.strip().lower()
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise InvalidArgumentError(f"--unused-for {text!r} is not a duration; use e.g. 30m, 2h, "
                                   "7d or 0") from None
