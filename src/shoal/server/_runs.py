"""Routes of the ``RunStore`` port: experiments, runs, their parameters, tags, artifacts and
job links, and metrics of any series. Each route is one store call, with the owner check
(server/_owners.py) in front of every change: new experiments and runs belong to the caller;
anyone may add a run to an experiment, only a run's owner (or an admin) changes or deletes it,
and only the owner of an experiment and of all its runs deletes it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from shoal.core.experiments import MetricPoint, RunArtifact
from shoal.core.ports import JobStore, RunStore
from shoal.errors import InvalidArgumentError
from shoal.server._owners import caller, require_owner
from shoal.server._wire import (
    ArtifactIn,
    BucketsOut,
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

#: The widest chart a thinned read serves (pixels).
MAX_BUCKETS = 8192
_RUN = "/experiments/{experiment}/runs/{run}"
Owner = Annotated[str, Query(min_length=1, description="run:<experiment>/<run> or job:<name>")]


def run_routes(store: RunStore) -> APIRouter:  # noqa: C901 - one small closure per route
    api = APIRouter()
    jobs = store if isinstance(store, JobStore) else None

    def own_run(request: Request, experiment: str, run: str, action: str) -> None:
        record = store.get_run(experiment, run)
        require_owner(request, record.owner, action,
                      f"run {run!r} of experiment {experiment!r}")

    def own_series(request: Request, owner: str) -> None:
        kind, _, rest = owner.partition(":")
        if kind == "run" and "/" in rest:
            experiment, _, run = rest.partition("/")
            record = store.find_run(experiment, run)  # a series may come before its run
            if record is not None:
                require_owner(request, record.owner, "write metrics of",
                              f"run {run!r} of experiment {experiment!r}")
        elif kind == "job" and rest:
            job = jobs.find_job(rest) if jobs is not None else None
            if job is not None:
                require_owner(request, job.owner, "write metrics of", f"job {rest!r}")
        else:
            raise InvalidArgumentError(f"metrics owner {owner!r} is neither "
                                       "run:<experiment>/<run> nor job:<name>", owner=owner)

    @api.get("/experiments", tags=["experiments"])
    def list_experiments() -> list[ExperimentOut]:
        return [ExperimentOut.model_validate(e) for e in store.list_experiments()]

    @api.put("/experiments/{experiment}", tags=["experiments"])
    def ensure_experiment(request: Request, experiment: str, body: ExperimentIn
                          ) -> ExperimentOut:
        return ExperimentOut.model_validate(store.ensure_experiment(
            experiment, display_name=body.display_name, tags=body.tags, owner=caller(request)))

    @api.get("/experiments/{experiment}", tags=["experiments"])
    def get_experiment(experiment: str) -> ExperimentOut:
        return ExperimentOut.model_validate(store.get_experiment(experiment))

    @api.delete("/experiments/{experiment}", tags=["experiments"])
    def delete_experiment(request: Request, experiment: str) -> dict[str, int]:
        found = store.find_experiment(experiment)
        if found is not None:
            what = f"experiment {experiment!r}"
            require_owner(request, found.owner, "delete", what)
            for run in store.list_runs(experiment):
                require_owner(request, run.owner, "delete",
                              f"{what} (its run {run.run_name!r})")
        return {"runs": store.delete_experiment(experiment)}

    @api.post("/experiments/{experiment}/runs", tags=["runs"], status_code=201)
    def create_run(request: Request, experiment: str, body: RunIn) -> RunOut:
        return RunOut.model_validate(store.create_run(
            experiment, body.run_name, display_name=body.display_name, tags=body.tags,
            owner=caller(request)))

    @api.get("/experiments/{experiment}/runs", tags=["runs"])
    def list_runs(experiment: str) -> list[RunOut]:
        return [RunOut.model_validate(r) for r in store.list_runs(experiment)]

    @api.get("/experiments/{experiment}/last-metric", tags=["runs"])
    def last_metric_of_runs(experiment: str, name: Annotated[str, Query(min_length=1)]
                            ) -> dict[str, float]:
        """The last value of metric *name* of each run of *experiment* that has it."""
        return store.last_metric_of_runs(experiment, name)

    @api.get("/runs", tags=["runs"])
    def runs_for_job(job: Annotated[str, Query(min_length=1)]) -> list[RunOut]:
        return [RunOut.model_validate(r) for r in store.runs_for_job(job)]

    @api.get(_RUN, tags=["runs"])
    def get_run(experiment: str, run: str) -> RunOut:
        return RunOut.model_validate(store.get_run(experiment, run))

    @api.delete(_RUN, tags=["runs"])
    def delete_run(request: Request, experiment: str, run: str) -> dict[str, bool]:
        if store.find_run(experiment, run) is not None:
            own_run(request, experiment, run, "delete")
        return {"deleted": store.delete_run(experiment, run)}

    @api.post(_RUN + "/end", tags=["runs"], status_code=204)
    def end_run(request: Request, experiment: str, run: str, body: EndIn) -> None:
        own_run(request, experiment, run, 'end')
        store.end_run(experiment, run, status=body.status)

    @api.post(_RUN + "/resume", tags=["runs"], status_code=204)
    def resume_run(request: Request, experiment: str, run: str) -> None:
        own_run(request, experiment, run, 'resume')
        store.resume_run(experiment, run)

    @api.post(_RUN + "/parameters", tags=["runs"], status_code=204)
    def set_run_parameters(request: Request, experiment: str, run: str, body: ParametersIn) -> None:
        own_run(request, experiment, run, 'set parameters of')
        store.set_run_parameters(experiment, run, body.parameters)

    @api.post(_RUN + "/tags", tags=["runs"], status_code=204)
    def set_run_tags(request: Request, experiment: str, run: str, body: TagsIn) -> None:
        own_run(request, experiment, run, 'set tags of')
        store.set_run_tags(experiment, run, body.tags)

    @api.post(_RUN + "/artifacts", tags=["runs"], status_code=204)
    def add_run_artifact(request: Request, experiment: str, run: str, body: ArtifactIn) -> None:
        own_run(request, experiment, run, 'add an artifact to')
        store.add_run_artifact(experiment, run, RunArtifact(
            body.name, body.value, body.media_type, body.is_output, body.artifact_type))

    @api.put(_RUN + "/jobs/{job}", tags=["runs"], status_code=204)
    def link_run_job(request: Request, experiment: str, run: str, job: str) -> None:
        own_run(request, experiment, run, "link a job to")
        store.link_run_job(experiment, run, job)

    @api.post("/metrics", tags=["metrics"], status_code=204)
    def add_metrics(request: Request, owner: Owner, body: MetricsIn) -> None:
        own_series(request, owner)
        store.add_metrics(owner, [MetricPoint(*p) for p in body.points])

    @api.get("/metrics", tags=["metrics"])
    def get_metrics(owner: Owner, name: str | None = None) -> MetricsOut:
        points = store.get_metrics(owner, name)
        return MetricsOut(points=[(p.name, p.value, p.timestamp, p.step) for p in points])

    @api.get("/metrics/last", tags=["metrics"])
    def last_metrics(owner: Annotated[list[str], Query(min_length=1, max_length=500)]
                     ) -> dict[str, dict[str, float]]:
        """The last value of each metric of each *owner* (``last_metrics``)."""
        return store.last_metrics(owner)

    @api.get("/metrics/buckets", tags=["metrics"])
    def metric_buckets(owner: Owner, name: str,
                       buckets: Annotated[int, Query(ge=1, le=MAX_BUCKETS)]) -> BucketsOut:
        """Metric *name* thinned for a chart *buckets* pixels wide (``metric_buckets``)."""
        found = store.metric_buckets(owner, name, buckets)
        return BucketsOut(name=found.name, count=found.count, x_is_step=found.x_is_step,
                          points=[(p.name, p.value, p.timestamp, p.step) for p in found.points])

    @api.get("/metrics/names", tags=["metrics"])
    def metric_names(owner: Owner) -> list[str]:
        return store.metric_names(owner)

    @api.get("/metrics/summaries", tags=["metrics"])
    def metric_summaries(owner: Owner) -> list[SummaryOut]:
        return [SummaryOut.model_validate(s) for s in store.metric_summaries(owner)]

    return api
