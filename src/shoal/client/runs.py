"""``HttpRunStore``: the ``RunStore`` port (experiments, runs, metrics) over a team server.

Paths name experiments and runs (SageMaker's charset needs no escaping); a metrics owner
(``run:<experiment>/<run>``, ``job:<name>``) travels as a query parameter. Records come back
as the same frozen ``core`` values the SQL store returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

from shoal.client.http import ServerConnection
from shoal.core.downsample import MetricBuckets
from shoal.core.experiments import (
    ExperimentRecord,
    MetricPoint,
    MetricSummary,
    ParameterValue,
    RunArtifact,
    RunRecord,
    RunStatus,
    check_metric_value,
)
from shoal.errors import ExperimentNotFound, RunNotFound

__all__ = ["HttpRunStore"]


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _experiment(body: Mapping[str, Any]) -> ExperimentRecord:
    created = _time(body["created_at"])
    assert created is not None
    return ExperimentRecord(body["name"], body["display_name"], created,
                            tags=dict(body["tags"]), run_count=int(body["run_count"]),
                            owner=str(body["owner"]))


def _artifact(body: Mapping[str, Any]) -> RunArtifact:
    return RunArtifact(body["name"], body["value"], body["media_type"], bool(body["is_output"]),
                       body["artifact_type"])


def _run(body: Mapping[str, Any]) -> RunRecord:
    created = _time(body["created_at"])
    assert created is not None
    return RunRecord(body["experiment_name"], body["run_name"], body["display_name"],
                     RunStatus(body["status"]), created, _time(body["ended_at"]),
                     parameters=dict(body["parameters"]), tags=dict(body["tags"]),
                     jobs=tuple(body["jobs"]),
                     artifacts=tuple(_artifact(a) for a in body["artifacts"]),
                     owner=str(body["owner"]))


def _point(p: Sequence[Any]) -> MetricPoint:
    return MetricPoint(p[0], float(p[1]), float(p[2]), None if p[3] is None else int(p[3]))


class HttpRunStore:
    """Experiments, runs and metrics through ``shoal server``'s ``/api/v1``."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection

    @classmethod
    def open(cls, url: str, token: str | None) -> HttpRunStore:
        return cls(ServerConnection(url, token))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HttpRunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- experiments --------------------------------------------------------------------

    def ensure_experiment(self, name: str, *, display_name: str | None = None,
                          tags: Mapping[str, str] | None = None,
                          owner: str = "local") -> ExperimentRecord:
        # *owner* is not sent: the server records its caller's user.
        return _experiment(self._http.call("PUT", f"/experiments/{_q(name)}", json={
            "display_name": display_name, "tags": dict(tags or {})}))

    def find_experiment(self, name: str) -> ExperimentRecord | None:
        try:
            return self.get_experiment(name)
        except ExperimentNotFound:
            return None

    def get_experiment(self, name: str) -> ExperimentRecord:
        return _experiment(self._http.call("GET", f"/experiments/{_q(name)}"))

    def list_experiments(self) -> list[ExperimentRecord]:
        return [_experiment(e) for e in self._http.call("GET", "/experiments")]

    def delete_experiment(self, name: str) -> int:
        return int(self._http.call("DELETE", f"/experiments/{_q(name)}")["runs"])

    # --- runs ---------------------------------------------------------------------------

    def create_run(self, experiment_name: str, run_name: str, *,
                   display_name: str | None = None,
                   tags: Mapping[str, str] | None = None, owner: str = "local") -> RunRecord:
        # *owner* is not sent: the server records its caller's user.
        return _run(self._http.call("POST", f"/experiments/{_q(experiment_name)}/runs", json={
            "run_name": run_name, "display_name": display_name, "tags": dict(tags or {})}))

    def find_run(self, experiment_name: str, run_name: str) -> RunRecord | None:
        try:
            return self.get_run(experiment_name, run_name)
        except (RunNotFound, ExperimentNotFound):
            return None

    def get_run(self, experiment_name: str, run_name: str) -> RunRecord:
        return _run(self._http.call("GET", _run_path(experiment_name, run_name)))

    def list_runs(self, experiment_name: str) -> list[RunRecord]:
        return [_run(r) for r in self._http.call("GET", f"/experiments/{_q(experiment_name)}/runs")]

    def runs_for_job(self, job_name: str) -> list[RunRecord]:
        return [_run(r) for r in self._http.call("GET", "/runs", params={"job": job_name})]

    def end_run(self, experiment_name: str, run_name: str, *, status: RunStatus) -> None:
        self._http.call("POST", _run_path(experiment_name, run_name) + "/end",
                        json={"status": RunStatus(status).value})

    def resume_run(self, experiment_name: str, run_name: str) -> None:
        self._http.call("POST", _run_path(experiment_name, run_name) + "/resume")

    def set_run_parameters(self, experiment_name: str, run_name: str,
                           parameters: Mapping[str, ParameterValue]) -> None:
        self._http.call("POST", _run_path(experiment_name, run_name) + "/parameters",
                        json={"parameters": dict(parameters)})

    def set_run_tags(self, experiment_name: str, run_name: str,
                     tags: Mapping[str, str]) -> None:
        self._http.call("POST", _run_path(experiment_name, run_name) + "/tags",
                        json={"tags": dict(tags)})

    def add_run_artifact(self, experiment_name: str, run_name: str,
                         artifact: RunArtifact) -> None:
        self._http.call("POST", _run_path(experiment_name, run_name) + "/artifacts", json={
            "name": artifact.name, "value": artifact.value, "media_type": artifact.media_type,
            "is_output": artifact.is_output, "artifact_type": artifact.artifact_type})

    def link_run_job(self, experiment_name: str, run_name: str, job_name: str) -> None:
        self._http.call("PUT", _run_path(experiment_name, run_name) + f"/jobs/{_q(job_name)}")

    def delete_run(self, experiment_name: str, run_name: str) -> bool:
        return bool(self._http.call("DELETE", _run_path(experiment_name, run_name))["deleted"])

    # --- metrics ------------------------------------------------------------------------

    def add_metrics(self, owner: str, points: Sequence[MetricPoint]) -> None:
        if not points:
            return
        for p in points:  # as the SQL store does; JSON has no NaN or infinity to send
            check_metric_value(p.name, p.value)
        self._http.call("POST", "/metrics", params={"owner": owner}, json={
            "points": [[p.name, p.value, p.timestamp, p.step] for p in points]})

    def get_metrics(self, owner: str, name: str | None = None) -> list[MetricPoint]:
        params = {"owner": owner} if name is None else {"owner": owner, "name": name}
        return [_point(p) for p in self._http.call("GET", "/metrics", params=params)["points"]]

    def last_metrics(self, owners: Sequence[str]) -> dict[str, dict[str, float]]:
        wanted = list(dict.fromkeys(owners))
        out: dict[str, dict[str, float]] = {}
        for i in range(0, len(wanted), 500):  # the server's limit per request
            found = self._http.call("GET", "/metrics/last",
                                    params=[("owner", o) for o in wanted[i:i + 500]])
            out.update({str(o): {str(k): float(v) for k, v in m.items()}
                        for o, m in found.items()})
        return out

    def last_metric_of_runs(self, experiment_name: str, name: str) -> dict[str, float]:
        found = self._http.call("GET", f"/experiments/{_q(experiment_name)}/last-metric",
                                params={"name": name})
        return {str(run): float(value) for run, value in found.items()}

    def metric_buckets(self, owner: str, name: str, buckets: int) -> MetricBuckets:
        found = self._http.call("GET", "/metrics/buckets",
                                params={"owner": owner, "name": name, "buckets": str(buckets)})
        return MetricBuckets(name=str(found["name"]), count=int(found["count"]),
                             x_is_step=bool(found["x_is_step"]),
                             points=tuple(_point(p) for p in found["points"]))

    def metric_names(self, owner: str) -> list[str]:
        return list(self._http.call("GET", "/metrics/names", params={"owner": owner}))

    def metric_summaries(self, owner: str) -> list[MetricSummary]:
        return [MetricSummary(s["name"], int(s["count"]), float(s["min"]), float(s["max"]),
                              float(s["avg"]), float(s["last"]))
                for s in self._http.call("GET", "/metrics/summaries", params={"owner": owner})]


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _run_path(experiment_name: str, run_name: str) -> str:
    return f"/experiments/{_q(experiment_name)}/runs/{_q(run_name)}"
