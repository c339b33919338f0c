"""``HttpMaintenance``: ``shoal gc``, ``shoal jobs delete`` and ``shoal workers`` through a
team server (``server/_maintenance.py``): the server removes and stops on its own stores and
host; answers are the JSON documents the CLI prints (``Removal.to_json``, ``Worker.to_json``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shoal.client.http import ServerConnection

__all__ = ["HttpMaintenance"]


class HttpMaintenance:
    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection

    def gc(self, *, older_than_seconds: float, statuses: Sequence[str],
           dry_run: bool) -> dict[str, Any]:
        doc: dict[str, Any] = self._http.call("POST", "/maintenance/gc", json={
            "older_than_seconds": older_than_seconds, "statuses": list(statuses),
            "dry_run": dry_run})
        return doc

    def remove_jobs(self, names: Sequence[str], *, dry_run: bool) -> dict[str, Any]:
        doc: dict[str, Any] = self._http.call("POST", "/maintenance/job-removals",
                                              json={"names": list(names), "dry_run": dry_run})
        return doc

    def workers(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._http.call("GET", "/maintenance/workers")
        return found

    def stop_workers(self, pids: Sequence[int], *, all_: bool,
                     grace_seconds: float) -> list[dict[str, Any]]:
        done: list[dict[str, Any]] = self._http.call(
            "POST", "/maintenance/workers/stop",
            json={"pids": list(pids), "all": all_, "grace_seconds": grace_seconds})
        return done
