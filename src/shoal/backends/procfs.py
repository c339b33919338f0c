"""Process facts from /proc: start ticks (to tell a reused pid apart) and zombie state."""

from __future__ import annotations

__all__ = ["process_state", "start_ticks"]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    return raw[raw.rindex(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None
