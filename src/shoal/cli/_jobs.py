"""``shoal jobs``: list, describe, logs, metrics, cancel."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shoal.cli._complete import complete_job
from shoal.cli._context import ExitCode, emit, err, exit_code_for_status, out, state
from shoal.cli._render import (
    elapsed_seconds,
    format_duration,
    format_time,
    key_values,
    listing,
    mask_env,
    parse_since,
    print_json,
    record_json,
    shorten,
    status_text,
)
from shoal.core.experiments import job_owner
from shoal.core.jobs import JobSpec, JobStatus

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

    from shoal.core.experiments import MetricSummary
    from shoal.core.jobs import JobRecord

__all__ = ["JOB_NAME", "app"]

#: The job-name argument of every command that takes one (completes from the store).
JOB_NAME = typer.Argument(help="The job's name.", autocompletion=complete_job)

app = typer.Typer(
    help="Find, inspect, follow and stop jobs.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("list")
def list_jobs(
    status: Annotated[list[JobStatus] | None, typer.Option(
        "--status", "-s", metavar="STATUS",
        help="Only jobs in this state (repeat for several): "
             + ", ".join(s.value for s in JobStatus) + ".")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", "-n", help="Only jobs whose name contains this text.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only jobs created within this long ago: 30m, 2h, 1d...")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many jobs.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List jobs, newest first. Jobs whose supervisor died are marked failed first."""
    from shoal.core.ports import JobQuery

    created_after = None
    if since is not None:
        try:
            created_after = datetime.now(UTC) - parse_since(since)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--since") from None
    service = state.session().jobs
    _reap(service)
    records = service.metadata.list_jobs(JobQuery(
        statuses=tuple(status or ()), name_contains=name or None,
        created_after=created_after, limit=limit))
    if as_json:
        print_json([record_json(r) for r in records])
        return
    if not records:
        from shoal.storage.sql import redact_url

        where = redact_url(state.session().settings.resolved_metadata_url())
        err().print(f"no jobs match in {where}" if (status or name or since) else
                    f"no jobs yet in {where}")
        return
    emit(_table(records))


def _reap(service: Any) -> None:
    """End the records of jobs whose supervisor is gone; a backend that does not answer (a
    Ray head that is down) leaves them as recorded, and says so, within seconds."""
    service.reap()
    if service.liveness_unknown is not None:
        err().print(f"note: {service.liveness_unknown}. Jobs shown as pending or running may "
                    "have ended with it.", markup=False, highlight=False)


def _table(records: list[JobRecord]) -> Table:
    table = listing("name", "status", "created", "duration", "instance", "failure",
                    right=("duration",), wrap=("failure",))
    for r in records:
        failure = ""
        if r.failure_reason:
            kind = f"{r.failure_kind}: " if r.failure_kind else ""
            failure = shorten(f"{kind}{r.failure_reason}")
        table.add_row(r.name, status_text(r.status), format_time(r.created_at),
                      format_duration(elapsed_seconds(r)), r.spec.instance_type or "-", failure)
    return table


@app.command()
def describe(
    name: Annotated[str, JOB_NAME],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Show everything recorded about a job (secret-looking env values are masked)."""
    session = state.session()
    service = session.jobs
    _reap(service)
    record = service.get(name)
    log_uri = service.log_uri(name)
    runs_store = session.runs  # the metadata store, or the team server's
    summaries = runs_store.metric_summaries(job_owner(name))
    runs = runs_store.runs_for_job(name)
    disk = _disk_usage(name)
    if as_json:
        data = record_json(record, log_uri=log_uri)
        data["disk"] = disk
        data["metrics"] = [{"name": s.name, "count": s.count, "min": s.min, "max": s.max,
                            "avg": s.avg, "last": s.last} for s in summaries]
        data["runs"] = [{"experiment_name": r.experiment_name, "run_name": r.run_name}
                        for r in runs]
        print_json(data)
        return
    sections = _describe_sections(record, log_uri)
    sections.insert(1, ("On disk", key_values([
        ("artifacts", _size(disk["artifact_bytes"])),
        ("payloads in the database", _size(disk["database_bytes"])),
        ("work directory", _size(disk["workdir_bytes"])),
        ("total", _size(disk["total_bytes"]))])))
    if runs:
        sections.append(("Experiment runs", key_values(
            [(f"{r.experiment_name}/{r.run_name}",
              f"shoal {state.home_option()}runs show {r.run_name} --experiment "
              f"{r.experiment_name}") for r in runs])))
    if summaries:
        sections.append(("Metrics", _metrics_summary(summaries, name)))
    for i, (title, body) in enumerate(sections):
        if i:
            out().print()
        out().print(title, style="bold")
        emit(body)


def _disk_usage(name: str) -> dict[str, int]:
    """What the job keeps: its stored artifacts, its small payloads in the database, and its
    work directory on this machine."""
    from shoal.jobs.workfiles import job_disk_usage

    session = state.session()
    return job_disk_usage(session.jobs.artifacts, session.home / "work", name,
                          session.jobs.metadata)


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024 ** 2:.1f} MiB ({n} bytes)" \
        if n >= 1024 ** 2 else f"{n / 1024:.1f} KiB ({n} bytes)"


def _metrics_summary(summaries: list[MetricSummary], job: str) -> Table:
    rows = [(s.name, f"{s.count} points, last {s.last:.6g}") for s in summaries]
    rows.append(("plot", f"shoal {state.home_option()}jobs metrics {job}"))
    return key_values(rows)


@app.command()
def metrics(
    name: Annotated[str, JOB_NAME],
    metric: Annotated[str | None, typer.Option(
        "--metric", "-m", help="The metric to plot (default: the first by name).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print JSON: {job, metrics: [{name, count, min, max, avg, last}], "
                       "series (with --metric): [{value, step, timestamp}]}.")] = False,
) -> None:
    """A job's metrics: count, min, max, mean and last value of each, and a plot of one."""
    from shoal.cli._experiments import metric_plot, metrics_json, metrics_table

    service = state.session().jobs
    service.get(name)  # JobNotFound names the job
    owner = job_owner(name)
    summaries = service.metrics.metric_summaries(owner)
    if as_json:
        data: dict[str, Any] = {"job": name, "metrics": metrics_json(summaries)}
        if metric is not None:
            _check_metric(name, metric, summaries)
            data["series"] = [{"value": p.value, "step": p.step, "timestamp": p.timestamp}
                              for p in service.metrics.get_metrics(owner, metric)]
        print_json(data)
        return
    if not summaries:
        if metric is not None:
            from shoal.errors import InvalidArgumentError

            raise InvalidArgumentError(f"job {name} has no metrics ({metric!r} asked for)",
                                       job=name, metric=metric)
        err().print(f"job {name} has no metrics")
        return
    plot = metric_plot(service.metrics, owner, summaries, metric)
    emit(metrics_table(summaries))
    out().print()
    out().print(plot, highlight=False, markup=False)


def _check_metric(job: str, metric: str, summaries: list[MetricSummary]) -> None:
    from shoal.errors import InvalidArgumentError

    names = [s.name for s in summaries]
    if metric not in names:
        raise InvalidArgumentError(f"job {job} has no metric named {metric!r}; its metrics: "
                                   f"{', '.join(names) or 'none'}", job=job, metric=metric)


def _describe_sections(r: JobRecord, log_uri: str) -> list[tuple[str, RenderableType]]:
    from rich.text import Text

    spec = r.spec
    handle = dict(r.handle)
    supervisor = (f"pid {handle['pid']} on {handle.get('host', '?')}" if handle.get("pid")
                  else f"Ray actor {handle['actor']}" if handle.get("actor")
                  else "not started")
    job: list[tuple[str, RenderableType]] = [
           ("name", r.name), ("status", status_text(r.status)), ("owner", r.owner),
           ("kind", str(spec.kind)),
           ("function", spec.function_name or "-"),
           ("backend", f"{r.backend} (supervisor {supervisor})"),
           ("created", format_time(r.created_at)), ("started", format_time(r.started_at)),
           ("ended", format_time(r.ended_at)), ("updated", format_time(r.updated_at)),
           ("duration", format_duration(elapsed_seconds(r))),
           ("attempt", f"{r.attempt} of {spec.max_retry_attempts}"),
           ("exit code", "-" if r.exit_code is None else str(r.exit_code)),
           ("env setup", format_duration(r.env_setup_seconds))]
    if r.failure_kind or r.failure_reason:
        job.append(("failure kind", str(r.failure_kind or "-")))
        job.append(("failure reason", Text(r.failure_reason or "-", style="red")))
    memory = f"{spec.memory_mib} MiB" if spec.memory_mib else "-"
    spec_rows = [("instance type", spec.instance_type or "-"), ("cpus", f"{spec.cpus:g}"),
                 ("memory", memory),
                 ("gpus", f"{spec.gpus} (cpu fallback {'allowed' if spec.allow_cpu_fallback else 'off'})"),
                 ("python", spec.python_version or "-"),
                 ("dependencies", spec.dependencies or "-"),
                 ("max runtime", f"{spec.max_runtime_in_seconds} s"),
                 ("max retry attempts", str(spec.max_retry_attempts)),
                 ("stop grace period", f"{spec.stop_grace_period_in_seconds:g} s")]
    spec_rows += _spec_part_rows(spec)
    env = mask_env(spec.environment_variables)
    sections: list[tuple[str, RenderableType]] = [
        ("Job", key_values(job)),
        ("Spec", key_values(spec_rows)),
        ("Environment variables", key_values([(k, str(v)) for k, v in env.items()])
         if env else Text("(none)", style="dim")),
        ("Tags", key_values([(k, v) for k, v in spec.tags])
         if spec.tags else Text("(none)", style="dim")),
        ("Inert settings (kept for SageMaker; no effect on this backend)",
         key_values([(k, json.dumps(v, default=str)) for k, v in spec.inert_settings.items()])
         if spec.inert_settings else Text("(none)", style="dim")),
        *_training_section(r),
        ("Status history", _history(r)),
        ("Logs", key_values([("uri", log_uri),
                             ("print", f"shoal {state.home_option()}jobs logs {r.name}"),
                             ("follow", f"shoal {state.home_option()}jobs logs {r.name} -f")])),
    ]
    return sections


def _spec_part_rows(spec: JobSpec) -> list[tuple[str, str]]:
    """The spec's optional parts that are set (the import path and training have their own)."""
    rows = [("conda env", spec.conda_env), ("gpu fallback", spec.gpu_fallback),
            ("checkpoints", spec.checkpoint_s3_uri),
            ("distribution", spec.distribution and
             f"{spec.distribution.hosts} host(s) x {spec.distribution.per_host} process(es)"
             + (" (torchrun)" if spec.distribution.torchrun else "")),
            ("workdir", spec.workdir and f"{spec.workdir.sha256[:12]} ({spec.workdir.files} "
             f"files, {spec.workdir.size_bytes} bytes)"),
            ("run", spec.run and f"{spec.run.experiment_name}/{spec.run.run_name}"),
            ("batch", spec.batch and f"{spec.batch.id} #{spec.batch.index}"),
            ("client", spec.client and f"pid {spec.client.pid} on {spec.client.host}"),
            ("strict versions", "yes" if spec.strict_versions else None),
            ("import sagemaker", "yes" if spec.sagemaker_alias else None)]
    rows += [("framework notice", n) for n in spec.framework_notices]
    return [(k, v) for k, v in rows if v]


def _history(r: JobRecord) -> Table:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column()
    for event in r.events:
        table.add_row(format_time(event.at), status_text(event.status), event.reason or "")
    return table


def _write_chunk(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


@app.command()
def logs(
    name: Annotated[str, JOB_NAME],
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing until the job ends; exit 0 if it completed, "
                               "1 if it failed, 5 if it was stopped.")] = False,
    tail: Annotated[int | None, typer.Option(
        "--tail", "-n", min=0, metavar="N",
        help="Only the last N lines (with -f: then follow from there).")] = None,
) -> None:
    """Print a job's output (stdout and stderr of the function, as captured)."""
    service = state.session().jobs
    record = service.get(name)
    if not follow:
        log = service.read_log(name)
        _write_chunk(log if tail is None else _last_lines(log, tail))
        if not record.is_terminal:
            err().print(f"job {name} is still {record.status}; "
                        f"'shoal {state.home_option()}jobs logs {name} -f' follows it",
                        style="dim")
        return
    try:
        write = _write_chunk
        if tail is not None:  # the last lines so far, then what comes after them
            so_far = service.read_log(name)
            _write_chunk(_last_lines(so_far, tail))
            write = _Skip(len(so_far)).write
        record = service.wait(name, on_output=write)
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    _report_end(record)
    raise typer.Exit(exit_code_for_status(record.status))


def _last_lines(log: bytes, lines: int) -> bytes:
    return b"".join(log.splitlines(keepends=True)[-lines:]) if lines else b""


class _Skip:
    """Writes a followed log but its first *size* bytes (already shown)."""

    def __init__(self, size: int) -> None:
        self._skip = size

    def write(self, chunk: bytes) -> None:
        if self._skip:
            cut = min(self._skip, len(chunk))
            chunk, self._skip = chunk[cut:], self._skip - cut
        if chunk:
            _write_chunk(chunk)


def _report_end(record: JobRecord) -> None:
    message = f"job {record.name} {record.status}"
    if record.status == JobStatus.FAILED:
        message += f" ({record.failure_kind}): {shorten(record.failure_reason, 200)}"
    style = "green" if record.status == JobStatus.COMPLETED else "red" if \
        record.status == JobStatus.FAILED else "yellow"
    err().print(message, style=style)


@app.command()
def cancel(
    name: Annotated[str, JOB_NAME],
    wait: Annotated[bool, typer.Option(
        "--wait", help="Wait until the job has ended; exit 0 if it stopped (or completed "
                       "first), 1 if it failed before the stop took effect.")] = False,
) -> None:
    """Stop a job: SIGTERM, then SIGKILL after its stop grace period."""
    service = state.session().jobs
    record = service.get(name)
    if record.is_terminal:
        out().print(f"job {name} has already ended: {record.status}")
        return
    record = service.cancel(name)
    out().print(f"stop requested for job {name} (now {record.status})")
    if not wait:
        return
    try:
        record = service.wait(name)
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if record.status == JobStatus.STOPPED:
        out().print(f"job {name} stopped")
        return
    out().print(f"job {name} {record.status} before the stop took effect")
    raise typer.Exit(exit_code_for_status(record.status))


def _training_section(r: JobRecord) -> list[tuple[str, RenderableType]]:
    """A script job's training settings: script, hyperparameters, channels, outputs."""
    cfg = r.spec.training
    if cfg is None:
        return []
    rows = [("entry point", cfg.entry_point), ("estimator", cfg.estimator or "-"),
            ("source", cfg.source_uri or "-"), ("instance count", str(cfg.instance_count))]
    rows += [(f"hyperparameter {k}", json.dumps(v) if not isinstance(v, str) else v)
             for k, v in sorted(cfg.hyperparameters.items())]
    rows += [(f"channel {n}", str(c.get("uri"))) for n, c in cfg.channels.items()]
    rows += [(f"metric {d['Name']}", d["Regex"]) for d in cfg.metric_definitions]
    if cfg.checkpoint_s3_uri:
        rows.append(("checkpoints", f"{cfg.checkpoint_local_path} -> {cfg.checkpoint_s3_uri}"))
    if cfg.output_path or cfg.output_root:
        done = r.status == JobStatus.COMPLETED
        rows.append(("model data", cfg.model_data(r.name, "") if done
                     else "(written when the job completes)"))
    return [("Training", key_values(rows))]
