"""Experiments and runs in the SQL metadata store (mixed into ``SqlMetadataStore``); their
metrics are in ``_metrics``.

Same habits as the job methods: fixed SQL on the per-thread DB-API cursor, one transaction per
call, rows turned into frozen ``core`` records here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, overload

from sqlalchemy.engine.interfaces import DBAPICursor

from shoal.core.clock import Clock
from shoal.core.experiments import (
    ExperimentRecord,
    ParameterValue,
    RunArtifact,
    RunRecord,
    RunStatus,
)
from shoal.errors import (
    AlreadyExistsError,
    ExperimentNotFound,
    InvalidArgumentError,
    RunNotFound,
)
from shoal.storage.sql._dbapi import Dbapi

__all__ = ["RunTables"]


@overload
def _dt(value: float) -> datetime: ...
@overload
def _dt(value: float | None) -> datetime | None: ...
def _dt(value: float | None) -> datetime | None:
    """The UTC datetime of a stored timestamp (None stays None: a column not yet set)."""
    return None if value is None else datetime.fromtimestamp(value, UTC)



def require_experiment(db: Dbapi, cur: DBAPICursor, name: str) -> None:
    """ExperimentNotFound unless experiment *name* exists (after a read that found none of
    its rows, to tell an empty experiment from a missing one)."""
    cur.execute(db.sql("SELECT 1 FROM experiments WHERE name = ?"), (name,))
    if cur.fetchone() is None:
        raise ExperimentNotFound(f"no experiment named {name!r}; 'shoal experiments list' "
                                 "shows the experiments there", experiment=name)

class RunTables:
    """The experiment-tracking half of the SQL metadata store."""

    _db: Dbapi
    _clock: Clock

    def _now(self) -> float:
        return self._clock.now().timestamp()

    # --- experiments --------------------------------------------------------------------

    def ensure_experiment(self, name: str, *, display_name: str | None = None,
                          tags: Mapping[str, str] | None = None,
                          owner: str = "local") -> ExperimentRecord:
        """The experiment *name*, created with *display_name*, *tags* and *owner* if it is
        new (an existing one keeps its own)."""
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql(
                "INSERT INTO experiments (name, display_name, tags, created_at, owner) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING"),
                (name, display_name, json.dumps(dict(tags or {}), sort_keys=True), self._now(),
                 owner))
            record = self._experiment(cur, name)
        assert record is not None  # inserted, or there already, in this transaction
        return record

    def find_experiment(self, name: str) -> ExperimentRecord | None:
        with self._db.tx(write=False) as cur:
            return self._experiment(cur, name)

    def get_experiment(self, name: str) -> ExperimentRecord:
        record = self.find_experiment(name)
        if record is None:
            raise ExperimentNotFound(f"no experiment named {name!r}; 'shoal experiments list' "
                                     "shows the experiments there", experiment=name)
        return record

    def list_experiments(self) -> list[ExperimentRecord]:
        """Every experiment, newest first, with its number of runs."""
        with self._db.tx(write=False) as cur:
            cur.execute(_SELECT_EXPERIMENTS + " GROUP BY " + _EXPERIMENT_GROUP +
                        " ORDER BY e.created_at DESC, e.name")
            rows = cur.fetchall()
        return [_experiment_record(r) for r in rows]

    def _experiment(self, cur: DBAPICursor, name: str) -> ExperimentRecord | None:
        cur.execute(self._db.sql(_SELECT_EXPERIMENTS + " WHERE e.name = ? GROUP BY " +
                                 _EXPERIMENT_GROUP), (name,))
        row = cur.fetchone()
        return None if row is None else _experiment_record(row)

    # --- runs ---------------------------------------------------------------------------

    def create_run(self, experiment_name: str, run_name: str, *,
                   display_name: str | None = None,
                   tags: Mapping[str, str] | None = None, owner: str = "local") -> RunRecord:
        """A new run, in progress. AlreadyExistsError if the experiment has one so named."""
        now = self._now()
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql("SELECT 1 FROM experiments WHERE name = ?"),
                        (experiment_name,))
            if cur.fetchone() is None:
                raise ExperimentNotFound(f"no experiment named {experiment_name!r}",
                                         experiment=experiment_name)
            try:
                cur.execute(self._db.sql(
                    "INSERT INTO runs (experiment_name, run_name, display_name, status, "
                    "created_at, owner) VALUES (?, ?, ?, ?, ?, ?) RETURNING id"),
                    (experiment_name, run_name, display_name, RunStatus.IN_PROGRESS.value, now,
                     owner))
            except self._db.integrity_error as e:
                raise AlreadyExistsError(
                    f"experiment {experiment_name!r} already has a run named {run_name!r}",
                    experiment=experiment_name, run=run_name) from e
            row = cur.fetchone()
            assert row is not None  # INSERT ... RETURNING gives one row
            run_id = row[0]
            if tags:
                cur.executemany(self._db.sql(_UPSERT_TAG),
                                [(run_id, str(k), str(v)) for k, v in tags.items()])
        return RunRecord(experiment_name=experiment_name, run_name=run_name,
                         display_name=display_name, status=RunStatus.IN_PROGRESS,
                         created_at=_dt(now), owner=owner,
                         tags={str(k): str(v) for k, v in (tags or {}).items()})

    def find_run(self, experiment_name: str, run_name: str) -> RunRecord | None:
        with self._db.tx(write=False) as cur:
            runs = self._load_runs(cur, "r.experiment_name = ? AND r.run_name = ?",
                                   (experiment_name, run_name))
        return runs[0] if runs else None

    def get_run(self, experiment_name: str, run_name: str) -> RunRecord:
        record = self.find_run(experiment_name, run_name)
        if record is None:
            raise RunNotFound(f"no run named {run_name!r} in experiment {experiment_name!r}; "
                              f"'shoal experiments runs {experiment_name}' lists its runs",
                              experiment=experiment_name, run=run_name)
        return record

    def list_runs(self, experiment_name: str) -> list[RunRecord]:
        """The runs of an experiment, oldest first. ExperimentNotFound if there is none."""
        with self._db.tx(write=False) as cur:
            runs = self._load_runs(cur, "r.experiment_name = ?", (experiment_name,))
            if not runs:
                require_experiment(self._db, cur, experiment_name)
        return runs

    def runs_for_job(self, job_name: str) -> list[RunRecord]:
        """The runs *job_name* is linked to (usually one)."""
        with self._db.tx(write=False) as cur:
            return self._load_runs(
                cur, "r.id IN (SELECT run_id FROM run_jobs WHERE job_name = ?)", (job_name,))

    def end_run(self, experiment_name: str, run_name: str, *, status: RunStatus) -> None:
        """Record that the run ended with *status* (Completed, Failed or Stopped)."""
        status = RunStatus(status)
        if not status.is_terminal:
            raise InvalidArgumentError(f"end_run needs an end status, not {status}; "
                                       "resume_run puts a run back in progress")
        self._set_status(experiment_name, run_name, status, self._now())

    def resume_run(self, experiment_name: str, run_name: str) -> None:
        """Put an ended run back in progress (``load_run`` resumes it)."""
        self._set_status(experiment_name, run_name, RunStatus.IN_PROGRESS, None)

    def _set_status(self, experiment_name: str, run_name: str, status: RunStatus,
                    ended_at: float | None) -> None:
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql("UPDATE runs SET status = ?, ended_at = ? "
                                     "WHERE experiment_name = ? AND run_name = ?"),
                        (status.value, ended_at, experiment_name, run_name))
            if cur.rowcount == 0:
                raise _run_not_found(experiment_name, run_name)

    def set_run_parameters(self, experiment_name: str, run_name: str,
                           parameters: Mapping[str, ParameterValue]) -> None:
        """Set (or overwrite) parameters; values keep their type (str, int, float, bool)."""
        rows = [(str(k), json.dumps(v)) for k, v in parameters.items()]
        with self._db.tx(write=True) as cur:
            run_id = self._run_id(cur, experiment_name, run_name)
            cur.executemany(self._db.sql(
                "INSERT INTO run_parameters (run_id, name, value) VALUES (?, ?, ?) "
                "ON CONFLICT (run_id, name) DO UPDATE SET value = excluded.value"),
                [(run_id, k, v) for k, v in rows])

    def set_run_tags(self, experiment_name: str, run_name: str,
                     tags: Mapping[str, str]) -> None:
        with self._db.tx(write=True) as cur:
            run_id = self._run_id(cur, experiment_name, run_name)
            cur.executemany(self._db.sql(_UPSERT_TAG),
                            [(run_id, str(k), str(v)) for k, v in tags.items()])

    def add_run_artifact(self, experiment_name: str, run_name: str,
                         artifact: RunArtifact) -> None:
        """Record an artifact; one of the same name and direction is replaced."""
        with self._db.tx(write=True) as cur:
            run_id = self._run_id(cur, experiment_name, run_name)
            cur.execute(self._db.sql(
                "INSERT INTO run_artifacts (run_id, is_output, name, value, media_type, "
                "artifact_type, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, is_output, name) DO UPDATE SET value = excluded.value, "
                "media_type = excluded.media_type, artifact_type = excluded.artifact_type, "
                "created_at = excluded.created_at"),
                (run_id, bool(artifact.is_output), artifact.name, artifact.value,
                 artifact.media_type, artifact.artifact_type, self._now()))

    def link_run_job(self, experiment_name: str, run_name: str, job_name: str) -> None:
        """Record that *job_name* ran for the run (idempotent)."""
        with self._db.tx(write=True) as cur:
            run_id = self._run_id(cur, experiment_name, run_name)
            cur.execute(self._db.sql(
                "INSERT INTO run_jobs (run_id, job_name, linked_at) VALUES (?, ?, ?) "
                "ON CONFLICT (run_id, job_name) DO NOTHING"), (run_id, job_name, self._now()))

    def _run_id(self, cur: DBAPICursor, experiment_name: str, run_name: str) -> int:
        cur.execute(self._db.sql("SELECT id FROM runs WHERE experiment_name = ? AND "
                                 "run_name = ?"), (experiment_name, run_name))
        row = cur.fetchone()
        if row is None:
            raise _run_not_found(experiment_name, run_name)
        return int(row[0])

    def _load_runs(self, cur: DBAPICursor, where: str, params: tuple[Any, ...]) -> list[RunRecord]:
        sql = self._db.sql
        cur.execute(sql(f"SELECT r.id, r.experiment_name, r.run_name, r.display_name, "
                        f"r.status, r.created_at, r.ended_at, r.owner FROM runs r WHERE {where} "
                        "ORDER BY r.created_at, r.id"), params)
        rows = cur.fetchall()
        if not rows:
            return []
        children: dict[str, dict[int, list[Any]]] = {}
        for table, columns, order in _CHILDREN:
            cur.execute(sql(f"SELECT c.run_id, {columns} FROM {table} c JOIN runs r ON "
                            f"r.id = c.run_id WHERE {where} ORDER BY c.run_id, {order}"),
                        params)
            by_run: dict[int, list[Any]] = {}
            for row in cur.fetchall():
                by_run.setdefault(row[0], []).append(row[1:])
            children[table] = by_run
        return [_run_record(r, {t: c.get(r[0], []) for t, c in children.items()})
                for r in rows]


_SELECT_EXPERIMENTS = ("SELECT e.name, e.display_name, e.tags, e.created_at, COUNT(r.id), "
                       "e.owner FROM experiments e LEFT JOIN runs r ON r.experiment_name = e.name")
_EXPERIMENT_GROUP = "e.name, e.display_name, e.tags, e.created_at, e.owner"
_UPSERT_TAG = ("INSERT INTO run_tags (run_id, key, value) VALUES (?, ?, ?) "
               "ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value")
_CHILDREN = (
    ("run_parameters", "c.name, c.value", "c.name"),
    ("run_tags", "c.key, c.value", "c.key"),
    ("run_artifacts", "c.name, c.value, c.media_type, c.is_output, c.artifact_type",
     "c.created_at, c.name"),
    ("run_jobs", "c.job_name", "c.linked_at, c.job_name"),
)


def _run_not_found(experiment_name: str, run_name: str) -> RunNotFound:
    return RunNotFound(f"no run named {run_name!r} in experiment {experiment_name!r}; "
                       f"'shoal experiments runs {experiment_name}' lists its runs",
                       experiment=experiment_name, run=run_name)


def _experiment_record(row: Any) -> ExperimentRecord:
    return ExperimentRecord(name=row[0], display_name=row[1], tags=json.loads(row[2] or "{}"),
                            created_at=_dt(row[3]),
                            run_count=int(row[4]), owner=row[5])


def _run_record(row: Any, children: Mapping[str, list[Any]]) -> RunRecord:
    return RunRecord(
        experiment_name=row[1], run_name=row[2], display_name=row[3],
        status=RunStatus(row[4]), created_at=_dt(row[5]),
        ended_at=_dt(row[6]), owner=row[7],
        parameters={n: json.loads(v) for n, v in children["run_parameters"]},
        tags={k: v for k, v in children["run_tags"]},
        artifacts=tuple(RunArtifact(name=n, value=v, media_type=m, is_output=bool(o),
                                    artifact_type=t)
                        for n, v, m, o, t in children["run_artifacts"]),
        jobs=tuple(j for (j,) in children["run_jobs"]),
    )
