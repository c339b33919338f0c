"""What ``shoal jobs delete`` and ``shoal gc`` do: remove finished jobs, runs and experiments
with everything shoal stored for them, and say how much went. Run by the CLI on its own
stores, and by the team server on its stores for a client (``server/_maintenance.py``), so a
gc through the server is the server's own.

What a job leaves: its record, status history and metrics (metadata store); everything under
``<artifact root>/<job>/`` (payloads, shipped workdir, ``logs/``, ``output/``, checkpoints);
on this machine its supervisor log (``<home>/run/supervisors/<job>.log``) and work
directories (``<home>/work/<job>.*``). A run leaves its record, parameters, tags, metrics and
the artifacts it logged into shoal's artifact store (artifacts that point elsewhere, such as a
user's own ``s3://`` input, are the user's and stay). Files go first and the record last, so a
record that is gone means its files are too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from shoal.core.experiments import RunRecord
    from shoal.core.jobs import JobStatus
    from shoal.core.ports import ArtifactStore, MetadataStore

__all__ = ["Removal", "Stores", "delete_jobs", "delete_runs", "gc_plan", "job_bytes", "now",
           "run_bytes"]


class Stores(Protocol):
    """Where a removal happens: a ``Session`` is one (its home: this machine's files)."""

    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def artifacts(self) -> ArtifactStore: ...
    @property
    def home(self) -> Path: ...


@dataclass
class Removal:
    """What a delete or gc removes (or, in a dry run, would remove)."""

    jobs: list[str] = field(default_factory=list)
    runs: list[tuple[str, str]] = field(default_factory=list)
    experiments: list[str] = field(default_factory=list)
    bytes: int = 0

    def to_json(self, *, dry_run: bool) -> dict[str, Any]:
        return {"dry_run": dry_run, "jobs": self.jobs,
                "runs": [{"experiment_name": e, "run_name": r} for e, r in self.runs],
                "experiments": self.experiments, "bytes": self.bytes}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Removal:
        """A removal from ``to_json``'s document (a team server's answer)."""
        return cls([str(j) for j in doc["jobs"]],
                   [(str(r["experiment_name"]), str(r["run_name"])) for r in doc["runs"]],
                   [str(e) for e in doc["experiments"]], int(doc["bytes"]))


def _local_paths(session: Stores, name: str) -> list[Path]:
    home = session.home
    paths = [home / "run" / "supervisors" / f"{name}.log"]
    work = home / "work"
    if work.is_dir():
        paths += sorted(p for p in work.iterdir() if p.name.startswith(f"{name}."))
    return [p for p in paths if p.exists()]


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += (Path(root) / f).lstat().st_size
            except OSError:
                continue
    return total


def job_bytes(session: Stores, name: str) -> int:
    """Bytes stored for job *name*: its artifacts, its small payloads in the database and its
    files on this machine."""
    stored: int = (session.artifacts.disk_usage(name)
                   + session.metadata.job_payload_bytes(name))
    return stored + sum(_size(p) for p in _local_paths(session, name))


def _remove_job_files(session: Stores, name: str) -> None:
    session.artifacts.delete_prefix(name)
    for path in _local_paths(session, name):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def delete_jobs(session: Stores, names: Sequence[str], removal: Removal, *,
                dry_run: bool) -> None:
    """Remove finished jobs *names* (files, then records), adding them to *removal*."""
    for name in names:
        removal.bytes += job_bytes(session, name)
        removal.jobs.append(name)
        if not dry_run:
            _remove_job_files(session, name)
    if not dry_run and names:
        session.metadata.delete_jobs(list(names))


def _run_keys(session: Stores, run: RunRecord) -> list[str]:
    root = session.artifacts.root.rstrip("/") + "/"
    return [a.value[len(root):] for a in run.artifacts
            if a.is_output and a.value.startswith(root) and len(a.value) > len(root)]


def run_bytes(session: Stores, run: RunRecord) -> int:
    return sum(session.artifacts.disk_usage(k) for k in _run_keys(session, run))


def delete_runs(session: Stores, runs: Iterable[RunRecord], removal: Removal, *,
                dry_run: bool) -> None:
    for run in runs:
        removal.bytes += run_bytes(session, run)
        removal.runs.append((run.experiment_name, run.run_name))
        if not dry_run:
            for key in _run_keys(session, run):
                session.artifacts.delete_prefix(key)
            session.metadata.delete_run(run.experiment_name, run.run_name)


_RUN_STATUS = {"completed": "Completed", "failed": "Failed", "stopped": "Stopped"}


def gc_plan(session: Stores, cutoff: datetime, statuses: Sequence[JobStatus], *,
            owner: str | None = None) -> tuple[list[str], list[RunRecord], list[str]]:
    """What ``shoal gc`` removes: jobs in *statuses* that ended before *cutoff*; runs that
    ended before it with the matching status; experiments created before it whose runs all
    go (or that have none). With *owner*, only what *owner* owns (a team server's user who
    is not an admin)."""
    from shoal.core.ports import JobQuery

    metadata = session.metadata
    query = JobQuery(statuses=tuple(statuses), ended_before=cutoff, limit=10_000_000)
    jobs: list[str] = [r.name for r in metadata.list_jobs(query)
                       if owner is None or r.owner == owner]
    run_statuses = {_RUN_STATUS[str(s)] for s in statuses if str(s) in _RUN_STATUS}
    runs: list[RunRecord] = []
    experiments: list[str] = []
    for exp in metadata.list_experiments():
        all_runs = metadata.list_runs(exp.name)
        old = [r for r in all_runs if r.ended_at is not None and r.ended_at < cutoff
               and str(r.status) in run_statuses and (owner is None or r.owner == owner)]
        runs += old
        if len(old) == len(all_runs) and exp.created_at < cutoff and (
                owner is None or exp.owner == owner):
            experiments.append(exp.name)
    return jobs, runs, experiments


def now() -> datetime:
    return datetime.now(UTC)
