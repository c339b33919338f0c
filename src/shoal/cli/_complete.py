"""Shell completion of names from the metadata store: jobs, experiments, runs, endpoints.

A completion runs on every <TAB>, so it must be fast and silent: it opens the configured
database directly (no session, backend or artifact store), asks for at most ``_LIMIT`` names
that start with what was typed, and on any error (no database yet, a schema out of date, a
locked file, a bad setting) completes nothing rather than printing into the user's prompt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from shoal.core.ports import MetadataStore

__all__ = ["complete_endpoint", "complete_experiment", "complete_job", "complete_run"]

_LIMIT = 200


@contextlib.contextmanager
def _store(ctx: typer.Context) -> Iterator[Any]:
    from shoal.config import Settings
    from shoal.storage.sql import SqlMetadataStore

    root = ctx.find_root()
    home = root.params.get("home")
    settings = Settings(**({"home": str(home)} if home else {}))
    store = SqlMetadataStore.open(settings.resolved_metadata_url())
    try:
        yield store
    finally:
        store.close()


def _silent(names: Callable[[Any, typer.Context, str], list[str]]
            ) -> Callable[[typer.Context, list[str], str], list[str]]:
    def complete(ctx: typer.Context, args: list[str], incomplete: str) -> list[str]:
        try:
            with _store(ctx) as store:
                return [n for n in names(store, ctx, incomplete) if n.startswith(incomplete)]
        except Exception:  # completion never prints a traceback into the prompt
            return []

    complete.__name__ = names.__name__
    return complete


@_silent
def complete_job(store: MetadataStore, ctx: typer.Context, incomplete: str) -> list[str]:
    from shoal.core.ports import JobQuery

    return [r.name for r in store.list_jobs(JobQuery(name_prefix=incomplete or None,
                                                     limit=_LIMIT))]


@_silent
def complete_experiment(store: MetadataStore, ctx: typer.Context, incomplete: str) -> list[str]:
    return [e.name for e in store.list_experiments()][:_LIMIT]


@_silent
def complete_run(store: MetadataStore, ctx: typer.Context, incomplete: str) -> list[str]:
    experiment = ctx.params.get("experiment")
    names = [experiment] if experiment else [e.name for e in store.list_experiments()]
    runs = [r.run_name for name in names for r in store.list_runs(name)]
    return list(dict.fromkeys(runs))[:_LIMIT]


@_silent
def complete_endpoint(store: MetadataStore, ctx: typer.Context, incomplete: str) -> list[str]:
    return [e.name for e in store.list_endpoints()][:_LIMIT]
