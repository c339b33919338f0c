"""``shoal workers list|stop``: the launchers, warm workers and endpoint supervisors that run
in the background for this home (``--home``), and stopping them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from shoal.cli._context import emit, err, out, state
from shoal.cli._render import format_duration, listing, print_json

if TYPE_CHECKING:
    from shoal.backends.workers import Worker
    from shoal.client import HttpMaintenance

__all__ = ["app"]

app = typer.Typer(help="Background processes: launchers, warm workers, endpoint supervisors.",
                  no_args_is_help=True, rich_markup_mode=None)


def _workers() -> list[Worker]:
    from shoal.backends.local import LocalBackend
    from shoal.backends.workers import find_workers

    session = state.session()
    run_dir = session.home / "run"
    sockets: list[str] = []
    backend = session.backend
    if isinstance(backend, LocalBackend):  # its launcher's socket may live elsewhere
        sockets.append(backend.launcher_socket_path())
    endpoints = [(r.name, str(r.status), dict(r.supervisor))
                 for r in session.metadata.list_endpoints()]
    return find_workers(run_dir, str(session.home), launcher_sockets=sockets,
                        endpoints=endpoints)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.0f} MiB"


@app.command("list")
def list_workers(
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print JSON: [{pid, kind, home, name, state, idle_seconds, "
                       "rss_bytes}].")] = False,
) -> None:
    """Show what runs in the background: pid, kind, name, state, idle time, memory (through
    a team server: on the server's host, for an admin)."""
    remote = _remote()
    docs = remote.workers() if remote is not None else [w.to_json() for w in _workers()]
    if as_json:
        print_json(docs)
        return
    if not docs:
        err().print(f"nothing runs in the background for {_where()}")
        return
    table = listing("pid", "kind", "name", "state", "idle", "memory", "home",
                    right=("pid", "idle", "memory"))
    for w in docs:
        table.add_row(str(w["pid"]), w["kind"], w["name"], w["state"],
                      format_duration(w["idle_seconds"]), _mib(w["rss_bytes"]), w["home"])
    emit(table)


def _remote() -> HttpMaintenance | None:
    """The team server's worker listing when this shell uses one, else None."""
    session = state.session()
    if session.settings.server_url is None:
        return None
    from shoal.client import HttpMaintenance

    return HttpMaintenance(session.server_connection())


def _where() -> str:
    url = state.session().settings.server_url
    return f"the server {url}" if url is not None else str(state.session().home)


@app.command()
def stop(
    pids: Annotated[list[int] | None, typer.Argument(
        metavar="[PID]...", help="The workers to stop (from 'shoal workers list').",
        show_default=False)] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every one of this home.")] = False,
    grace: Annotated[float, typer.Option(
        "--grace", min=0, metavar="SECONDS",
        help="How long each may take to exit after SIGTERM before it is killed.")] = 10.0,
) -> None:
    """Stop background processes: SIGTERM, then SIGKILL after the grace period; their
    sockets are removed. A warm worker busy with a job stops that job too."""
    from shoal.backends.workers import stop_worker
    from shoal.errors import InvalidArgumentError, NotFoundError

    if bool(pids) == all_:
        raise InvalidArgumentError("give the pids to stop, or --all (not both)")
    remote = _remote()
    if remote is not None:  # the server stops its own host's workers
        stopped = remote.stop_workers(list(pids or ()), all_=all_, grace_seconds=grace)
        for done in stopped:
            out().print(f"{done['outcome']} {done['kind']} {done['name']} (pid "
                        f"{done['pid']}) on {_where()}")
        if not stopped:
            err().print(f"nothing runs in the background for {_where()}")
        return
    workers = _workers()
    if not all_:
        by_pid = {w.pid: w for w in workers}
        unknown = [p for p in pids or () if p not in by_pid]
        if unknown:
            raise NotFoundError(f"pid {', '.join(map(str, unknown))} is not a shoal worker of "
                                f"{state.session().home}; 'shoal workers list' shows them",
                                pids=unknown)
        workers = [by_pid[p] for p in dict.fromkeys(pids or ())]
    # Launchers last: a warm worker or supervisor never needs one to stop.
    workers.sort(key=lambda w: w.kind == "launcher")
    for w in workers:
        outcome = stop_worker(w, grace_seconds=grace)
        out().print(f"{outcome} {w.kind} {w.name} (pid {w.pid})")
    if not workers:
        err().print(f"nothing runs in the background for {state.session().home}")
