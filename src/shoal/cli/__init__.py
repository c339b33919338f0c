"""The ``shoal`` command: find, inspect, follow and stop jobs; show configuration; upgrade
the database; run the demo.

Example::

    $ shoal jobs list --status failed --since 2h
    $ shoal jobs describe divide-241130-120000-ab12cd
    $ shoal jobs logs divide-241130-120000-ab12cd -f

Errors print one red line (the traceback with ``-v``) and exit with a documented status
(``ExitCode``). Heavy modules are imported inside the commands, so ``shoal --help`` is fast; ``shoal server``
builds only its own sub-app (``_serve_app``), so the server starts without the other commands.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shoal.cli._context import ExitCode, err, exit_code_for, state

if TYPE_CHECKING:
    import typer

__all__ = ["app", "main"]

#: Options that take a value and may come before the command (``shoal --home DIR server``).
_VALUED_OPTIONS = frozenset({"--home"})


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # the whole tree, built on first use
        from shoal.cli._app import app

        return app
    raise AttributeError(f"module 'shoal.cli' has no attribute {name!r}")


def _command_of(args: Sequence[str]) -> str | None:
    """The first command word of *args* (after the global options), or None."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUED_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def _app_for(args: Sequence[str]) -> typer.Typer:
    """``shoal server ...`` gets a tree of the server's commands alone (start-up time: the
    server imports none of the other command modules); every other command the whole tree."""
    if _command_of(args) == "server":
        from shoal.cli._serve_app import app as server_only

        return server_only
    from shoal.cli._app import app as whole

    return whole


def _report(error: BaseException) -> ExitCode:
    from rich.text import Text

    code = exit_code_for(error)
    if state.verbose:
        import traceback

        err().print(Text("".join(traceback.format_exception(error)).rstrip(), style="dim"))
    message = str(error) or type(error).__name__
    if code == ExitCode.INTERNAL:
        message = (f"internal error: {type(error).__name__}: {message}"
                   + ("" if state.verbose else " (run with -v for the traceback)"))
    err().print(Text(f"error: {message}", style="bold red"))
    return code


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``shoal`` console script."""
    code: int = ExitCode.OK
    try:
        args = list(argv) if argv is not None else sys.argv[1:]
        _app_for(args)(args=args, prog_name="shoal")
    except SystemExit as e:  # click's normal way out: 0, 2 for usage, or a command's Exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        err().print("[red]interrupted[/]")
        code = ExitCode.INTERRUPTED
    except Exception as e:  # every error ends as one line and a documented exit code
        code = _report(e)
    finally:
        state.close()
    sys.exit(code)
