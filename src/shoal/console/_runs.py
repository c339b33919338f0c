"""The console's experiment pages: experiments, an experiment's runs (parameters and last
metric values as columns), a run with its metric charts, and the series the charts draw,
thinned by the store to the chart's width (``RunStore.metric_buckets``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, Response

from shoal.console._graphs import CURVES, GRAPHS, curve_series, load_graph, matrix_rows
from shoal.console._render import ago, page
from shoal.console._session import utcnow
from shoal.core.downsample import on_shared_x
from shoal.core.experiments import RunRecord, RunStatus
from shoal.core.ports import ArtifactStore, RunStore
from shoal.errors import ArtifactNotFound, InvalidArgumentError, RunNotFound

__all__ = ["run_routes", "select_runs"]

#: Columns of the runs table beyond these are left out (the run page shows them all).
_MAX_COLUMNS = 40
_MAX_WIDTH = 4096
#: Charts on a run's page (the rest of its metrics are listed).
_MAX_CHARTS = 12
#: Runs one comparison chart overlays.
MAX_COMPARE = 50
#: Runs per page of an experiment's runs table.
RUNS_PAGE = 50
#: What a comparison puts on x.
XAxis = Literal["step", "time"]


def _param_key(value: Any) -> tuple[int, float, str]:
    """Numbers by value, then text, then missing (whatever the order asked)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (2, 0.0, "") if value is None else (1, 0.0, str(value))
    return (0, float(value), "")


def select_runs(found: Sequence[RunRecord], *, name: str = "", status: str = "",
                sort: str = "created", descending: bool = True,
                last: Mapping[str, float] | None = None) -> list[RunRecord]:
    """*found* filtered (run name containing *name*, *status*) and sorted by ``created``,
    ``name``, ``status``, ``param:<key>`` or ``metric:<name>`` (by *last*, each run's last
    value of that metric, ``RunStore.last_metric_of_runs``); runs without the parameter or
    metric come last either way."""
    if status and status not in {s.value for s in RunStatus}:
        raise InvalidArgumentError(f"no run status is called {status!r}; pick one of "
                                   f"{', '.join(s.value for s in RunStatus)}", status=status)
    kept = [r for r in found if name in r.run_name and (not status or r.status.value == status)]
    if sort.startswith("param:"):
        key = sort.removeprefix("param:")
        present = [r for r in kept if key in r.parameters]
        present.sort(key=lambda r: _param_key(r.parameters[key]), reverse=descending)
        return present + [r for r in kept if key not in r.parameters]
    if sort.startswith("metric:"):
        if last is None:
            raise InvalidArgumentError(f"sorting by {sort!r} needs the runs' last values of "
                                       "the metric", sort=sort)
        values = last
        present = [r for r in kept if r.run_name in values]
        present.sort(key=lambda r: values[r.run_name], reverse=descending)
        return present + [r for r in kept if r.run_name not in values]
    order = {id(r): i for i, r in enumerate(kept)}  # the store's (creation) order breaks ties
    keys: dict[str, Callable[[RunRecord], Any]] = {
        "created": lambda r: (r.created_at, order[id(r)]), "name": lambda r: r.run_name,
        "status": lambda r: r.status.value}
    if sort not in keys:
        raise InvalidArgumentError(f"runs sort by created, name, status, param:<key> or "
                                   f"metric:<name>, not {sort!r}", sort=sort)
    return sorted(kept, key=keys[sort], reverse=descending)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def run_routes(runs: RunStore, artifacts: ArtifactStore) -> APIRouter:
    api = APIRouter()

    @api.get("/experiments")
    def experiments_page(request: Request) -> Response:
        now = utcnow()
        rows = [{"name": e.name, "display_name": e.display_name or "", "runs": e.run_count,
                 "owner": e.owner, "age": ago(e.created_at, now)}
                for e in sorted(runs.list_experiments(), key=lambda e: e.created_at,
                                reverse=True)]
        return page(request, "experiments.html", experiments=rows)

    @api.get("/experiments/{experiment}")
    def experiment_page(request: Request, experiment: str, name: str = "", status: str = "",
                        sort: str = "created", order: str = "desc",
                        page_number: Annotated[int, Query(alias="page", ge=1)] = 1) -> Response:
        record = runs.get_experiment(experiment)
        now = utcnow()
        every = runs.list_runs(experiment)
        by_metric = sort.removeprefix("metric:") if sort.startswith("metric:") else None
        # Sorting by a metric reads that metric's last value of every run, in one read.
        sort_values = runs.last_metric_of_runs(experiment, by_metric) if by_metric else None
        found = select_runs(every, name=name, status=status, sort=sort,
                            descending=order != "asc", last=sort_values)
        pages = max(1, -(-len(found) // RUNS_PAGE))
        shown = found[(page_number - 1) * RUNS_PAGE:page_number * RUNS_PAGE]
        # Last values are read for the runs shown only, in one read for the page.
        found_last = runs.last_metrics([run.metrics_owner for run in shown]) if shown else {}
        lasts = [found_last.get(run.metrics_owner, {}) for run in shown]
        params: dict[str, None] = {}
        for run in every:
            params.update(dict.fromkeys(run.parameters))
        metrics: dict[str, None] = {}
        for last in lasts:
            metrics.update(dict.fromkeys(last))
        if by_metric:
            metrics[by_metric] = None  # its column stays, even where this page has none
        param_cols = sorted(params)[:_MAX_COLUMNS]
        metric_cols = sorted(metrics)[:_MAX_COLUMNS]
        rows = [{"name": run.run_name, "status": run.status.value, "owner": run.owner,
                 "age": ago(run.created_at, now),
                 "cells": [_cell(run.parameters.get(c)) for c in param_cols]
                 + [_cell(last.get(c)) for c in metric_cols]}
                for run, last in zip(shown, lasts, strict=True)]
        filters = urlencode({k: v for k, v in (("name", name), ("status", status)) if v})
        kept = urlencode({k: v for k, v in (("name", name), ("status", status), ("sort", sort),
                                            ("order", order)) if v})
        return page(request, "experiment.html", experiment=record, rows=rows,
                    total=len(found), of=len(every), page_number=page_number, pages=pages,
                    param_cols=param_cols, metric_cols=metric_cols, max_compare=MAX_COMPARE,
                    name=name, status=status, sort=sort, order=order, kept=kept,
                    filters=filters,
                    statuses=[s.value for s in RunStatus],
                    sorts=["created", "name", "status", *(f"param:{c}" for c in sorted(params)),
                           *(f"metric:{c}" for c in metric_cols)],
                    flip="asc" if order != "asc" else "desc")

    def compared(experiment: str, run: list[str]) -> tuple[list[RunRecord], int]:
        """The runs to overlay (the ticked ones, else the newest) and how many were left
        out."""
        found = runs.list_runs(experiment)[::-1]
        if run:
            known = {r.run_name: r for r in found}
            missing = [name for name in run if name not in known]
            if missing:
                raise RunNotFound(f"experiment {experiment!r} has no run "
                                  f"{', '.join(map(repr, missing))}", experiment=experiment,
                                  runs=missing)
            found = [known[name] for name in dict.fromkeys(run)]
        return found[:MAX_COMPARE], max(0, len(found) - MAX_COMPARE)

    @api.get("/experiments/{experiment}/compare")
    def compare_page(request: Request, experiment: str, metric: str,
                     run: Annotated[list[str] | None, Query()] = None,
                     x: XAxis = "step") -> Response:
        record = runs.get_experiment(experiment)
        shown, left_out = compared(experiment, run or [])
        picked = [("metric", metric), *(("run", r.run_name) for r in shown)]
        return page(request, "compare.html", experiment=record, metric=metric, runs=shown,
                    left_out=left_out, query=urlencode([*picked, ("x", x)]), x=x,
                    by_step=urlencode([*picked, ("x", "step")]),
                    by_time=urlencode([*picked, ("x", "time")]))

    @api.get("/experiments/{experiment}/compare-series")
    def compare_series(experiment: str, metric: str,
                       run: Annotated[list[str] | None, Query()] = None,
                       width: Annotated[int, Query(ge=1)] = 800,
                       x: XAxis = "step") -> Response:
        """*metric* of each run, thinned to *width* like ``/series``, named by its run, on
        one shared x (``on_shared_x``): the steps (where every run's points have one) or,
        with ``x=time``, the times."""
        shown, _ = compared(experiment, run or [])
        width = min(width, _MAX_WIDTH)
        found = _in_parallel(lambda r: _thinned(runs, r.metrics_owner, metric, width,
                                                by_time=x == "time"), shown)
        by_step = all(s["x_is_step"] for s in found)
        if not by_step:  # some run has points without a step: all by time
            found = [s if not s["x_is_step"] else
                     _thinned(runs, r.metrics_owner, metric, width, by_time=True)
                     for r, s in zip(shown, found, strict=True)]
        xs, ys = on_shared_x([(s["x"], s["y"]) for s in found], width, integral=by_step)
        return JSONResponse({"experiment": experiment, "metric": metric, "x_is_step": by_step,
                             "x": xs, "series": [
                                 {"name": r.run_name, "points": s["points"], "y": y}
                                 for r, s, y in zip(shown, found, ys, strict=True)]})

    @api.get("/experiments/{experiment}/runs/{run}")
    def run_page(request: Request, experiment: str, run: str) -> Response:
        record = runs.get_run(experiment, run)
        summaries = runs.metric_summaries(record.metrics_owner)
        graphs = [a for a in record.artifacts if a.artifact_type in GRAPHS]
        matrices = []
        for graph in graphs:
            if graph.artifact_type == "ConfusionMatrix":
                matrices.append((graph.name, matrix_rows(load_graph(artifacts, graph))))
        return page(request, "run.html", run=record, summaries=summaries,
                    curves=[g.name for g in graphs if g.artifact_type in CURVES],
                    matrices=matrices,
                    charts=[s.name for s in summaries[:_MAX_CHARTS]],
                    metrics_owner=record.metrics_owner,
                    params=sorted(record.parameters.items()),
                    tags=sorted(record.tags.items()))

    @api.get("/experiments/{experiment}/runs/{run}/graph")
    def run_graph(experiment: str, run: str, name: str) -> Response:
        """A logged curve as one chart series (``/series``' shape, with axis labels)."""
        record = runs.get_run(experiment, run)
        found = [a for a in record.artifacts if a.name == name and a.artifact_type in CURVES]
        if not found:
            raise ArtifactNotFound(f"run {run!r} of experiment {experiment!r} logged no curve "
                                   f"named {name!r}", run=run, name=name)
        data = load_graph(artifacts, found[0])
        return JSONResponse({"series": [curve_series(name, data)]})

    @api.get("/series")
    def series(owner: str, name: Annotated[list[str], Query()],
               width: Annotated[int, Query(ge=1)] = 800) -> Response:
        """Each metric *name* of *owner*, at most ``2 * width`` points each: x the steps
        when every point has one, else the timestamps (epoch seconds)."""
        width = min(width, _MAX_WIDTH)
        if len(name) > 50:
            raise InvalidArgumentError(f"a chart draws at most 50 series, not {len(name)}")
        out = _in_parallel(lambda metric: _thinned(runs, owner, metric, width), name)
        return JSONResponse({"owner": owner, "series": out})

    return api


_T = TypeVar("_T")
_R = TypeVar("_R")
#: Series read at once for one chart: the store's reads overlap (SQLite and the network
#: release the GIL), while the points' decoding does not.
_READERS = 4


def _in_parallel(read: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    if len(items) < 2:
        return [read(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(_READERS, len(items))) as pool:
        return list(pool.map(read, items))


def _thinned(runs: RunStore, owner: str, metric: str, width: int, *,
             by_time: bool = False) -> dict[str, Any]:
    """One series of *owner* as a chart gets it: x the steps when every point has one (and
    not *by_time*), else the timestamps (epoch seconds); at most ``2 * width`` points,
    thinned by the store (``metric_buckets``: a 100,000-point series is not read whole)."""
    found = runs.metric_buckets(owner, metric, width)
    by_step = found.x_is_step and not by_time
    points = sorted(found.points, key=lambda p: p.timestamp) if by_time and found.x_is_step \
        else found.points  # thinned in step order: time on x must still ascend
    xs = [p.step if by_step and p.step is not None else p.timestamp for p in points]
    ys = [p.value for p in points]
    return {"name": metric, "x_is_step": by_step, "points": found.count, "x": xs,
            "y": [None if math.isnan(y) or math.isinf(y) else y for y in ys]}
