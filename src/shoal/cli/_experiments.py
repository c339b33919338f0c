"""``shoal experiments`` (list, runs) and ``shoal runs show``: experiment tracking on the
terminal, with metric summaries and a line plot of one metric."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from shoal.cli._complete import complete_experiment, complete_run
from shoal.cli._context import emit, err, out, state
from shoal.cli._render import (
    format_duration,
    format_time,
    iso,
    key_values,
    listing,
    print_json,
    shorten,
)

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table
    from rich.text import Text

    from shoal.core.experiments import MetricSummary, RunRecord
    from shoal.core.ports import MetricStore, RunStore

__all__ = ["experiments_app", "metric_plot", "metrics_json", "metrics_table", "runs_app"]

experiments_app = typer.Typer(help="Experiments and their runs.", no_args_is_help=True,
                              rich_markup_mode=None)
runs_app = typer.Typer(help="Inspect experiment runs.", no_args_is_help=True,
                       rich_markup_mode=None)

_JSON = "Print JSON instead of a table."
_RUN_STYLES = {"InProgress": "blue", "Completed": "green", "Failed": "bold red",
               "Stopped": "yellow"}


def _status(status: str) -> Text:
    from rich.text import Text

    return Text(str(status), style=_RUN_STYLES.get(str(status), ""))


def _value(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


@experiments_app.command("list")
def list_experiments(
    as_json: Annotated[bool, typer.Option("--json", help=_JSON)] = False,
) -> None:
    """List experiments, newest first, with their number of runs."""
    store = state.session().runs
    records = store.list_experiments()
    if as_json:
        print_json([{"name": e.name, "display_name": e.display_name, "tags": dict(e.tags),
                     "run_count": e.run_count, "created_at": iso(e.created_at)}
                    for e in records])
        return
    if not records:
        err().print("no experiments yet; 'with Run(experiment_name=...)' creates one")
        return
    table = listing("experiment", "display name", "runs", "created", right=("runs",))
    for e in records:
        table.add_row(e.name, e.display_name or "-", str(e.run_count), format_time(e.created_at))
    emit(table)


@experiments_app.command("runs")
def list_runs(
    experiment: Annotated[str, typer.Argument(help="The experiment's name.",
                                              autocompletion=complete_experiment)],
    sort: Annotated[str | None, typer.Option(
        "--sort", metavar="METRIC",
        help="Sort by the last value of this metric (or by this parameter).")] = None,
    desc: Annotated[bool, typer.Option("--desc", help="Sort in descending order.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help=_JSON)] = False,
) -> None:
    """The runs of an experiment: status, parameters and the last value of each metric."""
    store = state.session().runs
    runs = store.list_runs(experiment)
    if not runs and not as_json:
        store.get_experiment(experiment)  # ExperimentNotFound names it
        err().print(f"experiment {experiment} has no runs yet")
        return
    summaries = {r.run_name: {s.name: s for s in store.metric_summaries(r.metrics_owner)} for r in runs}
    metrics = sorted({name for by_name in summaries.values() for name in by_name})
    if sort is not None:
        runs = _sorted_runs(runs, summaries, sort, desc, metrics)
    if as_json:
        if not runs:
            store.get_experiment(experiment)
        print_json([{**run_json(r), "metrics": metrics_json(list(summaries[r.run_name].values()))}
                    for r in runs])
        return
    table = listing("run", "status", "created", "parameters", wrap=("parameters",))
    for name in metrics:
        table.add_column(name, justify="right", no_wrap=True)
    for r in runs:
        params = ", ".join(f"{k}={_value(v)}" for k, v in sorted(r.parameters.items()))
        last = [_value(summaries[r.run_name][m].last) if m in summaries[r.run_name] else "-"
                for m in metrics]
        table.add_row(r.run_name, _status(r.status), format_time(r.created_at),
                      shorten(params, 80) or "-", *last)
    emit(table)


def _sorted_runs(runs: list[RunRecord], summaries: dict[str, dict[str, MetricSummary]],
                 key: str, desc: bool, metrics: list[str]) -> list[RunRecord]:
    from shoal.errors import InvalidArgumentError

    params = sorted({p for r in runs for p in r.parameters})
    if key in metrics:
        def value(r: RunRecord) -> Any:
            s = summaries[r.run_name].get(key)
            return None if s is None else s.last
    elif key in params:
        def value(r: RunRecord) -> Any:
            return r.parameters.get(key)
    else:
        raise InvalidArgumentError(
            f"cannot sort by {key!r}: it is neither a metric ({', '.join(metrics) or 'none'}) "
            f"nor a parameter ({', '.join(params) or 'none'}) of these runs")
    present = [r for r in runs if value(r) is not None]
    missing = [r for r in runs if value(r) is None]  # always last
    try:
        present.sort(key=value, reverse=desc)
    except TypeError:  # a parameter with mixed types: compare as text
        present.sort(key=lambda r: str(value(r)), reverse=desc)
    return present + missing


@runs_app.command("show")
def show_run(
    run: Annotated[str, typer.Argument(help="The run's name.", autocompletion=complete_run)],
    experiment: Annotated[str | None, typer.Option(
        "--experiment", "-e", help="The run's experiment (needed when several have a run of "
                                   "this name).", autocompletion=complete_experiment)] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", "-m", help="The metric to plot (default: the first by name).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Everything recorded about a run: parameters, tags, artifacts, jobs, metrics and a plot."""
    store = state.session().runs
    record = store.get_run(experiment, run) if experiment else _find_run(store, run)
    summaries = store.metric_summaries(record.metrics_owner)
    if as_json:
        data = run_json(record)
        data["metrics"] = metrics_json(summaries)
        if metric is not None:
            metric_plot(store, record.metrics_owner, summaries, metric)  # checks the name
            data["series"] = [{"value": p.value, "step": p.step, "timestamp": p.timestamp}
                              for p in store.get_metrics(record.metrics_owner, metric)]
        print_json(data)
        return
    plot = metric_plot(store, record.metrics_owner, summaries, metric) if summaries else None
    if metric is not None and plot is None:
        from shoal.errors import InvalidArgumentError

        raise InvalidArgumentError(f"run {record.run_name!r} has no metrics to plot "
                                   f"({metric!r} asked for)", metric=metric)
    sections: list[tuple[str, Any]] = [
        ("Run", key_values(_run_rows(record))),
        ("Parameters", _or_none([(k, _value(v)) for k, v in sorted(record.parameters.items())])),
        ("Tags", _or_none(sorted(record.tags.items()))),
        ("Artifacts", _artifacts(record)),
        ("Jobs", _or_none([(j, f"shoal {state.home_option()}jobs describe {j}")
                           for j in record.jobs])),
        ("Metrics", metrics_table(summaries) if summaries else _none()),
    ]
    for i, (title, body) in enumerate(sections):
        if i:
            out().print()
        out().print(title, style="bold")
        emit(body)
    if plot is not None:
        out().print()
        out().print(plot, highlight=False, markup=False)


def _find_run(store: RunStore, run: str) -> RunRecord:
    from shoal.errors import InvalidArgumentError, RunNotFound

    found: list[RunRecord] = [r for e in store.list_experiments()
             if (r := store.find_run(e.name, run)) is not None]
    if not found:
        raise RunNotFound(f"no run named {run!r} in any experiment; 'shoal experiments list' "
                          "shows the experiments", run=run)
    if len(found) > 1:
        names = ", ".join(r.experiment_name for r in found)
        raise InvalidArgumentError(f"several experiments have a run named {run!r} ({names}); "
                                   "choose one with --experiment")
    return found[0]


def _run_rows(r: RunRecord) -> list[tuple[str, RenderableType]]:
    duration = None if r.ended_at is None else (r.ended_at - r.created_at).total_seconds()
    return [("experiment", r.experiment_name), ("run", r.run_name),
            ("display name", r.display_name or "-"), ("status", _status(r.status)),
            ("created", format_time(r.created_at)), ("ended", format_time(r.ended_at)),
            ("duration", format_duration(duration))]


def _none() -> Text:
    from rich.text import Text

    return Text("(none)", style="dim")


def _or_none(rows: list[tuple[str, RenderableType]]) -> Table | Text:
    return key_values(rows) if rows else _none()


def _artifacts(r: RunRecord) -> Table | Text:
    if not r.artifacts:
        return _none()
    table = listing("name", "direction", "type", "value", wrap=("value",))
    for a in r.artifacts:
        table.add_row(a.name, "output" if a.is_output else "input",
                      a.artifact_type or a.media_type or "-", a.value)
    return table


def metrics_table(summaries: list[MetricSummary]) -> Table:
    """METRIC, COUNT, MIN, MAX, AVG, LAST: one row per series."""
    numbers = ("count", "min", "max", "avg", "last")
    table = listing("metric", *numbers, right=numbers)
    for s in summaries:
        table.add_row(s.name, str(s.count), _value(s.min), _value(s.max), _value(s.avg),
                      _value(s.last))
    return table


def metrics_json(summaries: list[MetricSummary]) -> list[dict[str, Any]]:
    """One object per series: name, count, min, max, avg, last."""
    return [{"name": s.name, "count": s.count, "min": s.min, "max": s.max, "avg": s.avg,
             "last": s.last} for s in summaries]


def run_json(r: RunRecord) -> dict[str, Any]:
    """Every field of a run record as JSON-ready data."""
    return {"experiment_name": r.experiment_name, "run_name": r.run_name,
            "display_name": r.display_name, "status": str(r.status),
            "created_at": iso(r.created_at), "ended_at": iso(r.ended_at),
            "parameters": dict(r.parameters), "tags": dict(r.tags), "jobs": list(r.jobs),
            "artifacts": [{"name": a.name, "value": a.value, "media_type": a.media_type,
                           "is_output": a.is_output, "artifact_type": a.artifact_type}
                          for a in r.artifacts]}


def metric_plot(store: MetricStore, owner: str, summaries: list[MetricSummary],
                metric: str | None) -> str:
    """A line plot of *metric* (default: the first by name) of *owner*."""
    from shoal.cli._plot import line_plot
    from shoal.errors import InvalidArgumentError

    names = [s.name for s in summaries]
    name = metric or names[0]
    if name not in names:
        raise InvalidArgumentError(f"no metric named {name!r} here; the metrics are "
                                   f"{', '.join(names)}", metric=name)
    return line_plot(store.get_metrics(owner, name), title=name)
