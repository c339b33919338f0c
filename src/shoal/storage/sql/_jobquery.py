"""The WHERE and ORDER BY of ``list_jobs``: a ``JobQuery``'s filters (tags read from the
stored spec's JSON, on SQLite and PostgreSQL), its order and its keyset cursor; no I/O."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from shoal.core.ports import JobQuery, JobSort

__all__ = ["cursor_gone", "job_query_sql", "spec_text"]

def spec_text(spec: dict[str, Any] | list[Any]) -> str:
    """A spec's JSON as stored in ``jobs.spec`` (the tag filter's first test relies on it)."""
    return json.dumps(spec, sort_keys=True)


#: Jobs that have not ended (no duration) sort after every real duration, either way.
_NO_DURATION = {True: "-1.0", False: "1e300"}


def _keys(sort: JobSort, descending: bool) -> tuple[str, ...]:
    """The ORDER BY expressions of *sort*; every order ends in ``name`` (unique), so a
    job's place, and with it the keyset cursor, is exact."""
    if sort is JobSort.NAME:
        return ("name",)
    if sort is JobSort.STATUS:
        return ("status", "created_at", "name")
    if sort is JobSort.DURATION:
        return (f"COALESCE(ended_at - started_at, {_NO_DURATION[descending]})",
                "created_at", "name")
    return ("created_at", "name")


def _ts(dt: datetime) -> float:
    return dt.timestamp()


def _like_escape(text: str) -> str:
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


def _tag_sql(postgres: bool) -> str:
    """One ``(key, value)`` tag of the spec's ``tags`` (a JSON list of pairs): first the
    pair's text as the store writes it (``json.dumps``), a cheap test that rejects nearly
    every other row before its JSON is parsed, then the exact test on the parsed tags."""
    return "jobs.spec LIKE ? ESCAPE '!' AND " + _tag_json_sql(postgres)


def _tag_json_sql(postgres: bool) -> str:
    if postgres:  # not @> [[key, value]]: jsonb containment ignores the pair's order
        return ("EXISTS (SELECT 1 FROM jsonb_array_elements(CAST(jobs.spec AS jsonb) -> 'tags') "
                "AS tag WHERE tag ->> 0 = ? AND tag ->> 1 = ?)")
    return ("EXISTS (SELECT 1 FROM json_each(jobs.spec, '$.tags') AS tag "
            "WHERE json_extract(tag.value, '$[0]') = ? AND json_extract(tag.value, '$[1]') = ?)")


def _filters(query: JobQuery, postgres: bool) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if query.names:
        where.append(f"name IN ({', '.join('?' for _ in query.names)})")
        params += list(query.names)
    if query.statuses:
        where.append(f"status IN ({', '.join('?' for _ in query.statuses)})")
        params += [s.value for s in query.statuses]
    if query.name_prefix:
        where.append("name LIKE ? ESCAPE '!'")
        params.append(_like_escape(query.name_prefix) + "%")
    if query.name_contains:
        where.append("name LIKE ? ESCAPE '!'")
        params.append("%" + _like_escape(query.name_contains) + "%")
    if query.created_after is not None:
        where.append("created_at >= ?")
        params.append(_ts(query.created_after))
    if query.ended_before is not None:
        where.append("ended_at < ?")
        params.append(_ts(query.ended_before))
    if query.owner is not None:
        where.append("owner = ?")
        params.append(query.owner)
    for key, value in query.tags:
        where.append(_tag_sql(postgres))
        params += ["%" + _like_escape(spec_text([key, value])) + "%", key, value]
    return where, params


def job_query_sql(query: JobQuery, postgres: bool) -> tuple[str, list[Any]]:
    """`` WHERE … ORDER BY … LIMIT ?`` for *query*, and its parameters."""
    where, params = _filters(query, postgres)
    keys = _keys(query.sort, query.descending)
    op = "<" if query.descending else ">"
    if query.before is not None:
        # The first term lets the created_at index bound the scan.
        at = _ts(query.before[0])
        where.append("created_at <= ? AND (created_at < ? OR name < ?)")
        params += [at, at, query.before[1]]
    if query.after is not None:
        # The cursor job's values now, read in the same statement. The lone first key
        # first, so that an index on it (created_at, name, status) bounds the scan.
        cursor = "(SELECT {} FROM jobs AS cursor_job WHERE cursor_job.name = ?)"
        where.append(f"{keys[0]} {op}= {cursor.format(keys[0])}")
        params.append(query.after)
        if len(keys) > 1:
            where.append(f"({', '.join(keys)}) {op} {cursor.format(', '.join(keys))}")
            params.append(query.after)
        else:
            where[-1] = f"{keys[0]} {op} {cursor.format(keys[0])}"
    direction = " DESC" if query.descending else ""
    sql = f" WHERE {' AND '.join(where)}" if where else ""
    sql += " ORDER BY " + ", ".join(k + direction for k in keys) + " LIMIT ?"
    params.append(int(query.limit))
    return sql, params


def cursor_gone(query: JobQuery) -> str:
    """The message when ``query.after`` names no job (deleted since its page was read)."""
    return (f"the jobs list was asked for the jobs after {query.after!r}, which no longer "
            "exists (deleted since the previous page was read); start again from the first "
            "page")
