"""Logging set-up for the entry points only (``shoal`` CLI, the server).

The library never adds handlers or sets levels; a program that wants shoal's log records
configures logging itself, or calls this.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["configure"]

_HANDLER_NAME = "shoal-cli"


def configure(level: int | str = logging.WARNING, *, json: bool = False) -> None:
    """Send shoal's log records at *level* and above to stderr (rich-formatted on a terminal).

    Idempotent: a second call changes the level and keeps the one handler. *json* writes one
    JSON object a line instead (for the server's structured logs).
    """
    logger = logging.getLogger("shoal")
    logger.setLevel(level)
    for existing in logger.handlers:
        if existing.get_name() == _HANDLER_NAME:
            existing.setLevel(level)
            return
    if json:
        handler: logging.Handler = logging.StreamHandler()
        handler.setFormatter(_JsonFormatter())
    else:
        console = _terminal_console()
        if console is not None:
            from rich.logging import RichHandler

            handler = RichHandler(console=console, show_path=False, rich_tracebacks=False,
                                  markup=False)
            handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
        else:  # piped or captured: plain lines, not wrapped at 80 columns
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.set_name(_HANDLER_NAME)
    handler.setLevel(level)
    logger.addHandler(handler)
    logger.propagate = False


def _terminal_console() -> Any:
    """rich's console on stderr when it is a terminal, else None. rich is imported only
    when it may be one (~0.1-0.25 s of ``shoal server``'s start-up otherwise): stderr is a
    tty, or the variables by which rich is told it is (``TTY_COMPATIBLE``, ``FORCE_COLOR``)."""
    try:
        tty = bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr, or a closed one
        tty = False
    maybe = tty or "TTY_COMPATIBLE" in os.environ or "FORCE_COLOR" in os.environ
    if not maybe:
        return None
    from rich.console import Console

    console = Console(stderr=True)
    return console if console.is_terminal else None


class _JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message and any ``job_id`` extra."""

    def format(self, record: logging.LogRecord) -> str:
        import json as _json

        data = {"time": self.formatTime(record), "level": record.levelname,
                "logger": record.name, "message": record.getMessage()}
        job_id = getattr(record, "job_id", None)
        if job_id is not None:
            data["job_id"] = job_id
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return _json.dumps(data)
