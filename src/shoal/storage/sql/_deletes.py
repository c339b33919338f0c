"""Deleting what the metadata store holds: finished jobs, runs and experiments, with their
history, metrics and links (``shoal jobs delete``, ``shoal gc``).

Every delete is one transaction and names its children explicitly (a database opened without
``PRAGMA foreign_keys`` keeps no cascade), so nothing is left half-deleted. Deleting what is
not there is not an error: the count says what went.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy.engine.interfaces import DBAPICursor

from shoal.core.experiments import job_owner, run_owner
from shoal.core.jobs import JobStatus
from shoal.storage.sql._dbapi import Dbapi

__all__ = ["DeleteTables"]

_RUN_CHILDREN = ("run_parameters", "run_tags", "run_artifacts", "run_jobs")
_METRIC_TABLES = ("metrics", "metric_series", "metric_blocks", "metric_spans")
_CHUNK = 400  # bounded IN lists: SQLite limits bound parameters


def _chunks(values: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for i in range(0, len(values), _CHUNK):
        yield values[i:i + _CHUNK]


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


class DeleteTables:
    """The deleting half of the SQL metadata store."""

    _db: Dbapi

    def delete_jobs(self, names: Sequence[str]) -> list[str]:
        """Remove the named jobs that have ended: their records, status history, small
        payloads, metrics and links from runs. Jobs that have not ended are left as they are (stop them first).
        Returns the names removed."""
        names = list(dict.fromkeys(names))
        ended = [s.value for s in JobStatus if s.is_terminal]
        removed: list[str] = []
        sql = self._db.sql
        with self._db.tx(write=True) as cur:
            for chunk in _chunks(names):
                cur.execute(sql(f"SELECT name FROM jobs WHERE name IN ({_marks(chunk)}) AND "
                                f"status IN ({_marks(ended)})"), (*chunk, *ended))
                found = [str(r[0]) for r in cur.fetchall()]
                if not found:
                    continue
                marks = _marks(found)
                cur.execute(sql(f"DELETE FROM job_events WHERE job_name IN ({marks})"), found)
                # Its small payloads (revision 0005); the large ones are files under its prefix.
                cur.execute(sql(f"DELETE FROM job_payloads WHERE job_name IN ({marks})"), found)
                cur.execute(sql(f"DELETE FROM run_jobs WHERE job_name IN ({marks})"), found)
                for table in _METRIC_TABLES:
                    cur.execute(sql(f"DELETE FROM {table} WHERE owner IN ({marks})"),
                                [job_owner(n) for n in found])
                cur.execute(sql(f"DELETE FROM jobs WHERE name IN ({marks})"), found)
                removed += found
        return removed

    def delete_run(self, experiment_name: str, run_name: str) -> bool:
        """Remove a run with its parameters, tags, artifact records, job links and metrics;
        False when there was no such run. (The jobs it links are not deleted.)"""
        sql = self._db.sql
        with self._db.tx(write=True) as cur:
            cur.execute(sql("SELECT id FROM runs WHERE experiment_name = ? AND run_name = ?"),
                        (experiment_name, run_name))
            row = cur.fetchone()
            if row is None:
                return False
            self._delete_runs(cur, [int(row[0])], [run_owner(experiment_name, run_name)])
        return True

    def delete_experiment(self, name: str) -> int:
        """Remove an experiment and every run in it (as ``delete_run``); the number of runs
        removed, or -1 when there was no such experiment."""
        sql = self._db.sql
        with self._db.tx(write=True) as cur:
            cur.execute(sql("SELECT id, run_name FROM runs WHERE experiment_name = ?"),
                        (name,))
            rows = cur.fetchall()
            self._delete_runs(cur, [int(r[0]) for r in rows],
                              [run_owner(name, str(r[1])) for r in rows])
            cur.execute(sql("DELETE FROM experiments WHERE name = ?"), (name,))
            existed = bool(cur.rowcount)
        return len(rows) if existed else -1

    def _delete_runs(self, cur: DBAPICursor, ids: list[int], owners: list[str]) -> None:
        sql = self._db.sql
        for chunk in _chunks(ids):
            for table in _RUN_CHILDREN:
                cur.execute(sql(f"DELETE FROM {table} WHERE run_id IN ({_marks(chunk)})"),
                            list(chunk))
            cur.execute(sql(f"DELETE FROM runs WHERE id IN ({_marks(chunk)})"), list(chunk))
        for chunk in _chunks(owners):
            for table in _METRIC_TABLES:
                cur.execute(sql(f"DELETE FROM {table} WHERE owner IN ({_marks(chunk)})"),
                            list(chunk))
