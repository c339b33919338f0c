"""Endpoints and their server instances in the SQL metadata store (mixed into
``SqlMetadataStore``). Same habits as the job methods: fixed SQL on the per-thread DB-API
cursor, one transaction per call, rows turned into frozen ``core`` records here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine.interfaces import DBAPICursor

from shoal.core.clock import Clock
from shoal.core.endpoints import (
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
    InstanceStatus,
    check_endpoint_transition,
)
from shoal.errors import AlreadyExistsError, EndpointNotFound, InvalidTransitionError
from shoal.storage.sql._dbapi import Dbapi

__all__ = ["EndpointTables"]

_COLUMNS = ("name", "status", "model_data", "config", "failure_reason", "supervisor",
            "created_at", "updated_at", "owner")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM endpoints"
_SELECT_INSTANCES = ("SELECT endpoint_name, instance_index, host, port, pid, status, restarts "
                     "FROM endpoint_instances")


def _dt(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _not_found(name: str) -> EndpointNotFound:
    return EndpointNotFound(f"no endpoint named {name!r}; 'shoal endpoints list' shows the "
                            "endpoints there", endpoint=name)


class EndpointTables:
    """The endpoint half of the SQL metadata store."""

    _db: Dbapi
    _clock: Clock

    def create_endpoint(self, name: str, *, model_data: str, config: EndpointConfig,
                        owner: str = "local") -> EndpointRecord:
        """A new endpoint, Creating. AlreadyExistsError if one of that name exists."""
        now = self._clock.now().timestamp()
        with self._db.tx(write=True) as cur:
            try:
                cur.execute(self._db.sql(
                    "INSERT INTO endpoints (name, status, model_data, config, supervisor, "
                    "created_at, updated_at, owner) VALUES (?, ?, ?, ?, '{}', ?, ?, ?)"),
                    (name, EndpointStatus.CREATING.value, model_data,
                     json.dumps(config.to_json(), sort_keys=True), now, now, owner))
            except self._db.integrity_error as e:
                raise AlreadyExistsError(
                    f"an endpoint named {name!r} already exists; delete it first "
                    f"('shoal endpoints delete {name}' or predictor.delete_endpoint()) or "
                    "choose another endpoint_name", endpoint=name) from e
        return EndpointRecord(name=name, status=EndpointStatus.CREATING, model_data=model_data,
                              config=config, created_at=_dt(now), updated_at=_dt(now),
                              owner=owner)

    def find_endpoint(self, name: str) -> EndpointRecord | None:
        with self._db.tx(write=False) as cur:
            return self._endpoint(cur, name)

    def get_endpoint(self, name: str) -> EndpointRecord:
        record = self.find_endpoint(name)
        if record is None:
            raise _not_found(name)
        return record

    def list_endpoints(self) -> list[EndpointRecord]:
        """Every endpoint, newest first, with its instances."""
        with self._db.tx(write=False) as cur:
            cur.execute(_SELECT + " ORDER BY created_at DESC, name")
            rows = cur.fetchall()
            cur.execute(_SELECT_INSTANCES + " ORDER BY endpoint_name, instance_index")
            instances = cur.fetchall()
        by_name: dict[str, list[Any]] = {}
        for row in instances:
            by_name.setdefault(row[0], []).append(row)
        return [_record(r, by_name.get(r[0], ())) for r in rows]

    def update_endpoint(self, name: str, *, status: EndpointStatus,
                        expected: EndpointStatus | None = None,
                        failure_reason: str | None = None) -> EndpointRecord:
        """Move *name* to *status*, checking the allowed transitions (moving to the status it
        has already is allowed and only updates the failure reason)."""
        status = EndpointStatus(status)
        now = self._clock.now().timestamp()
        with self._db.tx(write=True) as cur:
            lock = " FOR UPDATE" if self._db.postgres else ""
            cur.execute(self._db.sql(_SELECT + " WHERE name = ?" + lock), (name,))
            row = cur.fetchone()
            if row is None:
                raise _not_found(name)
            current = EndpointStatus(row[1])
            if expected is not None and current != expected:
                raise InvalidTransitionError(
                    f"endpoint {name!r} is {current}, not {expected}; it cannot become {status}",
                    endpoint=name, current=str(current), new=str(status))
            if current != status:
                check_endpoint_transition(name, current, status)
            reason = failure_reason if failure_reason is not None else row[4]
            cur.execute(self._db.sql("UPDATE endpoints SET status = ?, failure_reason = ?, "
                                     "updated_at = ? WHERE name = ?"),
                        (status.value, reason, now, name))
            record = self._endpoint(cur, name)
        assert record is not None  # its row was read and updated in this transaction
        return record

    def set_endpoint_supervisor(self, name: str, handle: Mapping[str, Any]) -> None:
        """Record the endpoint's supervisor process (the backend's handle)."""
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql("UPDATE endpoints SET supervisor = ? WHERE name = ?"),
                        (json.dumps(dict(handle), sort_keys=True), name))
            if cur.rowcount == 0:
                raise _not_found(name)

    def put_endpoint_instance(self, name: str, instance: EndpointInstance) -> None:
        """Add or replace the instance with ``instance.index``."""
        now = self._clock.now().timestamp()
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql("SELECT 1 FROM endpoints WHERE name = ?"), (name,))
            if cur.fetchone() is None:
                raise _not_found(name)
            cur.execute(self._db.sql(
                "INSERT INTO endpoint_instances (endpoint_name, instance_index, host, port, pid, "
                "status, restarts, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (endpoint_name, instance_index) DO UPDATE SET host = excluded.host, "
                "port = excluded.port, pid = excluded.pid, status = excluded.status, "
                "restarts = excluded.restarts, updated_at = excluded.updated_at"),
                (name, instance.index, instance.host, instance.port, instance.pid,
                 InstanceStatus(instance.status).value, instance.restarts, now))
            cur.execute(self._db.sql("UPDATE endpoints SET updated_at = ? WHERE name = ?"),
                        (now, name))

    def remove_endpoint_instances(self, name: str) -> None:
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql("DELETE FROM endpoint_instances WHERE endpoint_name = ?"),
                        (name,))

    def delete_endpoint(self, name: str) -> bool:
        """Remove the endpoint and its instances; False when there was none (idempotent)."""
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql("DELETE FROM endpoint_instances WHERE endpoint_name = ?"),
                        (name,))
            cur.execute(self._db.sql("DELETE FROM endpoints WHERE name = ?"), (name,))
            return bool(cur.rowcount)

    def _endpoint(self, cur: DBAPICursor, name: str) -> EndpointRecord | None:
        cur.execute(self._db.sql(_SELECT + " WHERE name = ?"), (name,))
        row = cur.fetchone()
        if row is None:
            return None
        cur.execute(self._db.sql(_SELECT_INSTANCES + " WHERE endpoint_name = ? "
                                 "ORDER BY instance_index"), (name,))
        return _record(row, cur.fetchall())


def _record(row: Any, instances: Any) -> EndpointRecord:
    return EndpointRecord(
        name=row[0], status=EndpointStatus(row[1]), model_data=row[2],
        config=EndpointConfig.from_json(json.loads(row[3])), failure_reason=row[4],
        supervisor=json.loads(row[5] or "{}"), created_at=_dt(row[6]),
        updated_at=_dt(row[7]), owner=row[8],
        instances=tuple(EndpointInstance(index=i[1], host=i[2], port=i[3], pid=i[4],
                                         status=InstanceStatus(i[5]), restarts=i[6])
                        for i in instances))
