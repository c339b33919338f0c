"""What every ``shoal`` command shares: the global options, the session, consoles, exit codes.

Nothing heavy is imported here, so ``shoal --help`` stays fast; the session (SQLAlchemy,
fsspec, pydantic) is built on first use inside a command.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from shoal.core.jobs import JobStatus
    from shoal.session import Session

__all__ = ["ExitCode", "State", "emit", "err", "exit_code_for", "exit_code_for_status", "out",
           "state"]


class ExitCode(enum.IntEnum):
    """Exit statuses scripts can rely on (also listed in ``shoal --help``)."""

    OK = 0            # success; for commands that follow a job: it completed
    JOB_FAILED = 1    # the job followed by 'jobs logs -f' / 'jobs cancel --wait' failed
    USAGE = 2         # bad command line (click's own code)
    NOT_FOUND = 3     # no such job, experiment, run or endpoint
    CONFIG = 4        # bad settings or config file, or the database schema is out of date
    JOB_STOPPED = 5   # the job followed by 'jobs logs -f' was stopped
    ERROR = 6         # any other shoal error (store or backend unavailable, ...)
    INTERRUPTED = 130  # Ctrl-C
    INTERNAL = 70     # a bug in shoal (EX_SOFTWARE); -v shows the traceback


EXIT_CODES_HELP = (
    "Exit status: 0 success (a followed job completed); 1 the followed job failed; "
    "2 usage error; 3 job, experiment, run or endpoint not found; 4 configuration error or "
    "database schema out of date; 5 the followed job was stopped; 6 other error (store or "
    "backend unavailable); 70 internal error."
)


def exit_code_for(error: BaseException) -> ExitCode:
    """Map an exception to the documented exit code (by type, never by message)."""
    from shoal.errors import (
        ConfigError,
        InvalidArgumentError,
        JobCancelledError,
        JobFailedError,
        NotFoundError,
        SchemaOutOfDateError,
        ShoalError,
    )

    if isinstance(error, NotFoundError):
        return ExitCode.NOT_FOUND
    if isinstance(error, ConfigError | SchemaOutOfDateError):
        return ExitCode.CONFIG
    if isinstance(error, InvalidArgumentError):
        return ExitCode.USAGE
    if isinstance(error, JobCancelledError):
        return ExitCode.JOB_STOPPED
    if isinstance(error, JobFailedError):
        return ExitCode.JOB_FAILED
    if isinstance(error, ShoalError):
        return ExitCode.ERROR
    return ExitCode.INTERNAL


def exit_code_for_status(status: JobStatus) -> ExitCode:
    """The exit code that reports a finished job's end state."""
    from shoal.core.jobs import JobStatus

    if status == JobStatus.COMPLETED:
        return ExitCode.OK
    if status == JobStatus.STOPPED:
        return ExitCode.JOB_STOPPED
    return ExitCode.JOB_FAILED


@dataclass
class State:
    """The global options of one ``shoal`` invocation and the session built from them."""

    home: Path | None = None
    verbose: int = 0
    _sessions: dict[tuple[object, ...], Session] = field(default_factory=dict)

    def session_kwargs(self) -> dict[str, Any]:
        return {"home": str(self.home)} if self.home is not None else {}

    def session(self, *, config_files: Sequence[Path] = (), **settings: Any) -> Session:
        """A session for this invocation (``--home`` beats ``SHOAL_HOME``; a command's own
        *settings*, its flags, beat both)."""
        from shoal.session import Session

        key = (*config_files, *sorted(settings.items()))
        if key not in self._sessions:
            self._sessions[key] = Session(config_files=tuple(config_files),
                                          **{**self.session_kwargs(), **settings})
        return self._sessions[key]

    def home_option(self) -> str:
        """``--home PATH `` when one was given, so printed commands find the same jobs."""
        return f"--home {self.home} " if self.home is not None else ""

    def close(self) -> None:
        while self._sessions:
            self._sessions.popitem()[1].close()


state = State()


def _console(*, stderr: bool) -> Console:
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        # Piped or captured: do not wrap at 80 columns, so names and paths stay greppable.
        console = Console(stderr=stderr, highlight=False, width=400, soft_wrap=True)
    return console


_CONSOLES: dict[bool, Console] = {}


def out() -> Console:
    """The console for results (stdout)."""
    if False not in _CONSOLES:
        _CONSOLES[False] = _console(stderr=False)
    return _CONSOLES[False]


def err() -> Console:
    """The console for errors and notes (stderr)."""
    if True not in _CONSOLES:
        _CONSOLES[True] = _console(stderr=True)
    return _CONSOLES[True]


def emit(renderable: Any) -> None:
    """Print a table or grid on stdout; when piped, without the padding at line ends."""
    console = out()
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    console.file.write(text + "\n")
    console.file.flush()
