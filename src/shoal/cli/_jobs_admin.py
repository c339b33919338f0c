"""``shoal jobs submit`` (a command line as a job), ``shoal jobs delete`` and ``shoal gc``."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shoal.cli._complete import complete_job
from shoal.cli._context import ExitCode, err, exit_code_for_status, out, state
from shoal.cli._render import parse_since, print_json
from shoal.core.jobs import FailureKind, JobStatus

if TYPE_CHECKING:
    from shoal.client import HttpMaintenance
    from shoal.core.jobs import JobRecord

__all__ = ["SUBMIT_CONTEXT", "delete", "gc", "submit"]

#: Everything after the first word of the command is the command's, ``--flags`` included.
SUBMIT_CONTEXT = {"allow_interspersed_args": False}
_ENDED = [s for s in JobStatus if s.is_terminal]


def _env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--env")
        env[key] = value
    return env


def _prefix(command: list[str], name: str | None) -> str:
    """The job's name prefix: --name, else the script's stem (train.py: train), else the
    program's name."""
    if name is None:
        scripts = [Path(a).stem for a in command if a.endswith((".py", ".sh"))]
        name = scripts[0] if scripts else Path(command[0]).name
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return cleaned[:40] or "command"


def submit(
    command: Annotated[list[str], typer.Argument(
        metavar="-- COMMAND [ARG]...", help="What the job runs, in a copy of this directory "
        "(python is the job's interpreter).", show_default=False)],
    instance_type: Annotated[str | None, typer.Option(
        "--instance-type", help="The job's instance type (ml.m5.large, ...; default "
                                "local).")] = None,
    dependencies: Annotated[Path | None, typer.Option(
        "--dependencies", help="A requirements.txt (or conda environment.yml) the job's own "
                               "environment is built from.", exists=True, dir_okay=False)] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="KEY=VALUE", help="An environment variable of the job "
                                                "(repeat for several).")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="The job name's prefix (default: the script's name, e.g. train).")] = None,
    max_runtime: Annotated[int, typer.Option(
        "--max-runtime", min=1, metavar="SECONDS", help="Stop the job after this long.")] = 86400,
    wait: Annotated[bool, typer.Option(
        "--wait/--no-wait", help="Wait for the end and exit with the job's exit code (default), "
                                 "or print the job's name and return.")] = True,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Print the job's output while waiting.")] = False,
) -> None:
    """Run a command as a job, the current directory shipped as its source.

    Example: shoal jobs submit --instance-type ml.m5.large -- python train.py --epochs 3
    """
    from shoal.remote_function import RemoteOptions
    from shoal.remote_function.command import run_command

    session = state.session()
    options = RemoteOptions.from_kwargs({
        "sagemaker_session": session, "include_local_workdir": True,
        "instance_type": instance_type, "job_name_prefix": _prefix(command, name),
        "environment_variables": _env(env or []), "max_runtime_in_seconds": max_runtime,
        **({"dependencies": str(dependencies)} if dependencies else {})})
    spec, files = options.build_job(run_command, session)
    record = session.jobs.submit_function(spec, run_command, (list(command),), {}, files=files)
    if not wait and not follow:
        out().print(record.name)
        err().print(f"'shoal {state.home_option()}jobs logs {record.name} -f' follows it",
                    style="dim")
        return
    err().print(f"job {record.name} submitted", style="dim")
    from shoal.cli._jobs import _report_end, _write_chunk

    try:
        record = session.jobs.wait(record.name, on_output=_write_chunk if follow else None)
    except KeyboardInterrupt:
        err().print(f"job {record.name} keeps running; 'shoal {state.home_option()}jobs "
                    f"cancel {record.name}' stops it", style="yellow")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    _report_end(record)
    raise typer.Exit(_command_exit_code(record))


def _command_exit_code(record: JobRecord) -> int:
    """The command's own exit code when it exited non-zero; else the documented codes."""
    if (record.status == JobStatus.FAILED and record.failure_kind == FailureKind.EXIT_CODE
            and record.exit_code and 0 < record.exit_code < 256):
        return record.exit_code
    return int(exit_code_for_status(record.status))


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def delete(
    names: Annotated[list[str], typer.Argument(
        metavar="NAME...", help="The jobs' names.", autocompletion=complete_job)],
    force: Annotated[bool, typer.Option(
        "--force", help="Stop jobs that have not ended first (and wait for them).")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only say what would be removed.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print JSON: {dry_run, jobs, runs, experiments, bytes}.")] = False,
) -> None:
    """Delete jobs: their records, metrics, artifacts, logs and work directories."""
    from shoal.errors import InvalidArgumentError
    from shoal.jobs.cleanup import Removal, delete_jobs

    service = state.session().jobs
    service.reap()
    records = [service.get(n) for n in dict.fromkeys(names)]  # JobNotFound names the job
    running = [r for r in records if not r.is_terminal]
    if running and not force:
        shown = ", ".join(f"{r.name} ({r.status})" for r in running)
        raise InvalidArgumentError(f"job(s) {shown} have not ended; stop them with 'shoal jobs "
                                   "cancel', or give --force to stop and delete them",
                                   jobs=[r.name for r in running])
    if running and not dry_run:
        for r in running:
            service.cancel(r.name)
        for r in running:
            service.wait(r.name)
    remote = _maintenance()
    if remote is not None:  # the server removes them from its stores
        removal = Removal.from_json(remote.remove_jobs([r.name for r in records],
                                                       dry_run=dry_run))
    else:
        removal = Removal()
        delete_jobs(state.session(), [r.name for r in records], removal, dry_run=dry_run)
    _report(removal, dry_run=dry_run, as_json=as_json)


def _maintenance() -> HttpMaintenance | None:
    """The team server's gc and removals when this shell uses one, else None."""
    session = state.session()
    if session.settings.server_url is None:
        return None
    from shoal.client import HttpMaintenance

    return HttpMaintenance(session.server_connection())


def _report(removal: Any, *, dry_run: bool, as_json: bool) -> None:
    if as_json:
        print_json(removal.to_json(dry_run=dry_run))
        return
    verb = "would remove" if dry_run else "removed"
    for name in removal.jobs:
        out().print(f"{verb} job {name}")
    for experiment, run in removal.runs:
        out().print(f"{verb} run {experiment}/{run}")
    for experiment in removal.experiments:
        out().print(f"{verb} experiment {experiment}")
    err().print(f"{verb} {len(removal.jobs)} job(s), {len(removal.runs)} run(s), "
                f"{len(removal.experiments)} experiment(s), {_human(removal.bytes)}"
                + (" (dry run: nothing was deleted)" if dry_run else ""))


def gc(
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="AGE", help="Remove what ended longer ago than this: 30m, "
                                            "12h, 30d, 2w.")] = "30d",
    status: Annotated[list[JobStatus] | None, typer.Option(
        "--status", "-s", metavar="STATUS",
        help="Only jobs (and runs) that ended in this state (repeat for several; default: "
             "completed, failed and stopped).")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only say what would be removed and how much space it frees.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print JSON: {dry_run, jobs, runs, experiments, bytes}.")] = False,
) -> None:
    """Delete old jobs, runs and experiments with their artifacts, logs and metrics.

    Jobs that ended before AGE ago; runs that ended before then; experiments created before
    then whose runs all go. Jobs still running are never touched. Through a team server: the
    server's gc, of your own records (an admin's: of everyone's).
    """
    from shoal.errors import InvalidArgumentError
    from shoal.jobs.cleanup import Removal, delete_jobs, delete_runs, gc_plan, now

    try:
        age = parse_since(older_than)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--older-than") from None
    statuses = list(status or _ENDED)
    live = [s.value for s in statuses if not s.is_terminal]
    if live:
        raise InvalidArgumentError(f"--status {', '.join(live)}: gc removes only ended jobs "
                                   "(completed, failed, stopped)")
    remote = _maintenance()
    if remote is not None:  # the server's own gc, of what the caller may remove
        doc = remote.gc(older_than_seconds=max(age, timedelta(0)).total_seconds(),
                        statuses=[s.value for s in statuses], dry_run=dry_run)
        _report(Removal.from_json(doc), dry_run=dry_run, as_json=as_json)
        return
    session = state.session()
    session.jobs.reap()
    cutoff = now() - max(age, timedelta(0))
    jobs, runs, experiments = gc_plan(session, cutoff, statuses)
    removal = Removal()
    delete_jobs(session, jobs, removal, dry_run=dry_run)
    delete_runs(session, runs, removal, dry_run=dry_run)
    removal.experiments = experiments
    if not dry_run:
        for experiment in experiments:
            session.metadata.delete_experiment(experiment)
    _report(removal, dry_run=dry_run, as_json=as_json)
