"""Routes of the ``RunStore`` port: experiments, runs, their parameters, tags, artifacts and
job links, and metrics of any owner. Each route is one store call."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shoal.core.experiments import MetricPoint, RunArtifact
from shoal.core.ports import RunStore
from shoal.server._wire import (
    ArtifactIn,
    EndIn,
    ExperimentIn,
    ExperimentOut,
    MetricsIn,
    MetricsOut,
    ParametersIn,
    RunIn,
    RunOut,
    SummaryOut,
    TagsIn,
)

__all__ = ["run_routes"]

_RUN = "/experiments/{experiment}/runs/{run}"
Owner = Annotated[str, Query(min_length=1, description="run:<experiment>/<run> or job:<name>")]


def run_routes(store: RunStore) -> APIRouter:  # noqa: C901 - one small closure per route
    api = APIRouter()

    @api.get("/experiments", tags=["experiments"])
    def list_experiments() -> list[ExperimentOut]:
        return [ExperimentOut.model_validate(e) for e in store.list_experiments()]

    @api.put("/experiments/{experiment}", tags=["experiments"])
    def ensure_experiment(experiment: str, body: ExperimentIn) -> ExperimentOut:
        return ExperimentOut.model_validate(store.ensure_experiment(
            experiment, display_name=body.display_name, tags=body.tags))

    @api.get("/experiments/{experiment}", tags=["experiments"])
    def get_experiment(experiment: str) -> ExperimentOut:
        return ExperimentOut.model_validate(store.get_experiment(experiment))

    @api.delete("/experiments/{experiment}", tags=["experiments"])
    def delete_experiment(experiment: str) -> dict[str, int]:
        return {"runs": store.delete_experiment(experiment)}

    @api.post("/experiments/{experiment}/runs", tags=["runs"], status_code=201)
    def create_run(experiment: str, body: RunIn) -> RunOut:
        return RunOut.model_validate(store.create_run(
            experiment, body.run_name, display_name=body.display_name, tags=body.tags))

    @api.get("/experiments/{experiment}/runs", tags=["runs"])
    def list_runs(experiment: str) -> list[RunOut]:
        return [RunOut.model_validate(r) for r in store.list_runs(experiment)]

    @api.get("/runs", tags=["runs"])
    def runs_for_job(job: Annotated[str, Query(min_length=1)]) -> list[RunOut]:
        return [RunOut.model_validate(r) for r in store.runs_for_job(job)]

    @api.get(_RUN, tags=["runs"])
    def get_run(experiment: str, run: str) -> RunOut:
        return RunOut.model_validate(store.get_run(experiment, run))

    @api.delete(_RUN, tags=["runs"])
    def delete_run(experiment: str, run: str) -> dict[str, bool]:
        return {"deleted": store.delete_run(experiment, run)}

    @api.post(_RUN + "/end", tags=["runs"], status_code=204)
    def end_run(experiment: str, run: str, body: EndIn) -> None:
        store.end_run(experiment, run, status=body.status)

    @api.post(_RUN + "/resume", tags=["runs"], status_code=204)
    def resume_run(experiment: str, run: str) -> None:
        store.resume_run(experiment, run)

    @api.post(_RUN + "/parameters", tags=["runs"], status_code=204)
    def set_run_parameters(experiment: str, run: str, body: ParametersIn) -> None:
        store.set_run_parameters(experiment, run, body.parameters)

    @api.post(_RUN + "/tags", tags=["runs"], status_code=204)
    def set_run_tags(experiment: str, run: str, body: TagsIn) -> None:
        store.set_run_tags(experiment, run, body.tags)

    @api.post(_RUN + "/artifacts", tags=["runs"], status_code=204)
    def add_run_artifact(experiment: str, run: str, body: ArtifactIn) -> None:
        store.add_run_artifact(experiment, run, RunArtifact(
            body.name, body.value, body.media_type, body.is_output, body.artifact_type))

    @api.put(_RUN + "/jobs/{job}", tags=["runs"], status_code=204)
    def link_run_job(experiment: str, run: str, job: str) -> None:
        store.link_run_job(experiment, run, job)

    @api.post("/metrics", tags=["metrics"], status_code=204)
    def add_metrics(owner: Owner, body: MetricsIn) -> None:
        store.add_metrics(owner, [MetricPoint(*p) for p in body.points])

    @api.get("/metrics", tags=["metrics"])
    def get_metrics(owner: Owner, name: str | None = None) -> MetricsOut:
        points = store.get_metrics(owner, name)
        return MetricsOut(points=[(p.name, p.value, p.timestamp, p.step) for p in points])

    @api.get("/metrics/names", tags=["metrics"])
    def metric_names(owner: Owner) -> list[str]:
        return store.metric_names(owner)

    @api.get("/metrics/summaries", tags=["metrics"])
    def metric_summaries(owner: Owner) -> list[SummaryOut]:
        return [SummaryOut.model_validate(s) for s in store.metric_summaries(owner)]

    return api
