"""JobService: submits jobs, moves their state (it is the only writer), waits and collects."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.core.clock import Clock, SystemClock
from shoal.core.jobs import (
    BatchRef,
    ClientRef,
    FailureKind,
    JobChange,
    JobName,
    JobRecord,
    JobSpec,
    JobStatus,
)
from shoal.core.ports import (
    ArtifactStore,
    Backend,
    BatchLauncher,
    ExecContext,
    JobEnds,
    JobKeys,
    JobStore,
    JobWaiter,
    MetricStore,
    OutcomeRecorder,
    SaltingKeys,
)
from shoal.errors import (
    ArtifactNotFound,
    ArtifactStoreError,
    BackendUnavailableError,
    InvalidTransitionError,
    JobCancelledError,
    JobFailedError,
    JobTimeoutError,
    PayloadIntegrityError,
    ShoalError,
)
from shoal.jobs._orphans import why_orphaned
from shoal.jobs._payloads import load_payload, store_payloads
from shoal.jobs._training import ranks_of
from shoal.jobs._wake import WakeChannel, notify, open_channel
from shoal.jobs.keys import JOB_SECRETS_VAR, encode_handover
from shoal.jobs.relaunch import (
    RELAUNCH,
    may_relaunch,
    relaunch,
    supervisor_words,
)
from shoal.serialization import Payload, deserialize, resign, serialize
from shoal.serialization.keys import is_sealed, new_salt, open_env, payload_key, seal_env
from shoal.storage.artifacts import job_key

if TYPE_CHECKING:
    from shoal.jobs.batchclient import JobBatch

__all__ = ["JobService", "log_key"]

logger = logging.getLogger(__name__)

_HOST = socket.gethostname()

#: How long a waiting client goes on while the backend does not answer (jobs/service.py).
_BACKEND_WAIT_S = 30.0
_WAITER_SLICE_S = 10.0


def _local_modules(func: Callable[..., Any]) -> tuple[str, ...]:
    """The function's module, when it is the user's own file rather than an installed one."""
    import sys
    import sysconfig

    name = getattr(func, "__module__", None)
    module = sys.modules.get(name or "")
    path = getattr(module, "__file__", None)
    if not name or name == "__main__" or not path:
        return ()
    installed = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    resolved = str(Path(path).resolve())
    if any(resolved.startswith(str(Path(p).resolve())) for p in installed):
        return ()
    return (name,)


def _read_file(path: str, what: str) -> bytes:
    from shoal.errors import InvalidArgumentError

    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read the {what} file {path}: {e}",
                                   path=path) from e


_CLIENT: tuple[int, ClientRef] | None = None


def _with_client(spec: JobSpec) -> JobSpec:
    """*spec* naming the process that submits it (``client``: host, pid, start
    ticks), so that a record whose client died before a supervisor took it ends at once."""
    import os

    from shoal.backends.procfs import start_ticks

    global _CLIENT
    pid = os.getpid()
    if _CLIENT is None or _CLIENT[0] != pid:
        _CLIENT = (pid, ClientRef(socket.gethostname(), pid, start_ticks(pid)))
    return dataclasses.replace(spec, client=_CLIENT[1])


def log_key(job: str) -> str:
    return job_key(job, "logs", "output.log")


class JobService:
    """The use-case API for jobs. Collaborators arrive as arguments; nothing is looked up."""

    def __init__(self, metadata: JobStore, artifacts: ArtifactStore, backend: Backend, *,
                 metrics: MetricStore, supervisor_entrypoint: str,
                 supervisor_env: Mapping[str, str], supervisor_prepare: str | None = None,
                 clock: Clock | None = None, keys: JobKeys | None = None,
                 wake_dir: Path | None = None, ends: JobEnds | None = None) -> None:
        self.metadata = metadata
        #: Where a job's supervisor writes the job's metrics (``job:<name>``).
        self.metrics = metrics
        self.artifacts = artifacts
        self.backend = backend
        self._entrypoint = supervisor_entrypoint
        self._prepare = supervisor_prepare
        self._env = dict(supervisor_env)
        self._clock = clock or SystemClock()
        self._waiters: dict[str, JobWaiter] = {}
        self._functions: set[str] = set()  # digests of function pickles stored for batches
        #: Derives each job's secret (the client: from the user's secret). None in a job's
        #: supervisor, which knows only the secrets handed to it (``hand_over``).
        self.keys = keys
        self._handed: dict[str, str] = {}
        #: Where clients waiting on this host are woken when a job ends (``_wake.py``).
        self._wake_dir = wake_dir
        #: Through a team server: its long polls say when a job ends, and stream its log.
        self._ends = ends
        #: Why the last liveness check got no answer from the backend (None: it answered).
        self.liveness_unknown: BackendUnavailableError | None = None
        self._unanswered_since: float | None = None
        #: How long ``wait`` goes on while the backend does not answer, before it raises.
        self.backend_wait_seconds = _BACKEND_WAIT_S

    # --- keys -------------------------------------------------------------------------

    def hand_over(self, secrets: Mapping[str, str], *, only: bool = True) -> None:
        """In a job's supervisor: the secrets of the jobs it was handed; with *only*, it
        derives no other job's."""
        self._handed.update(secrets)
        if only:
            self.keys = None

    def job_secret(self, name: str) -> str:
        """The secret of job *name*, from which its payload and environment keys derive."""
        handed = self._handed.get(name)
        if handed is not None:
            return handed
        if self.keys is None:
            raise PayloadIntegrityError(
                f"the supervisor of job {name} was not handed the job's key ({JOB_SECRETS_VAR} "
                "was missing from its environment), so it cannot verify the job's payloads; "
                "submit the job again, with the same shoal version on client and node",
                job=name)
        salt = self.metadata.get_job_key_salt(name)
        if not salt:
            raise PayloadIntegrityError(
                f"job {name} was recorded before shoal derived job keys from the user's secret "
                "(metadata schema 0004 removed the key stored with it), so its payloads can no "
                "longer be verified and are not unpickled; nothing was tampered with. Run the "
                "job again to get its result.", job=name, reason="legacy-key")
        return self.keys.secret(name, salt)

    def payload_key(self, name: str) -> str:
        """The HMAC key of job *name*'s payloads."""
        return payload_key(self.job_secret(name))

    def unseal(self, record: JobRecord) -> JobRecord:
        """*record* with its secret environment variables decrypted (they are stored
        encrypted under the job's key)."""
        env = record.spec.environment_variables
        if not any(is_sealed(v) for v in env.values()):
            return record
        opened = open_env(env, self.job_secret(record.name), record.name)
        return dataclasses.replace(record, spec=dataclasses.replace(
            record.spec, environment_variables=opened))

    def _new_secret(self, spec: JobSpec) -> tuple[JobSpec, str, str]:
        """A new job's salt and secret, and its spec with the secret variables sealed."""
        [out] = self._new_secrets([spec])
        return out

    def _new_secrets(self, specs: Sequence[JobSpec]) -> list[tuple[JobSpec, str, str]]:
        """``_new_secret`` for several jobs, their secrets asked for at once (one request
        through a team server)."""
        if self.keys is None:
            from shoal.errors import ConfigError

            raise ConfigError("this process (a job's supervisor) cannot submit jobs: it holds "
                              "no user secret")
        if isinstance(self.keys, SaltingKeys):  # a team server's lease: no request
            salts, secrets = map(list, zip(*self.keys.new_secrets([s.name for s in specs]),
                                           strict=True)) if specs else ([], [])
        else:
            salts = [new_salt() for _ in specs]
            secrets = self.keys.secrets([(spec.name, salt) for spec, salt in
                                         zip(specs, salts, strict=True)])
        out = []
        for spec, salt, secret in zip(specs, salts, secrets, strict=True):
            spec = _with_client(spec)  # a record whose client dies unlaunched ends at once
            sealed = seal_env(spec.environment_variables, secret, spec.name)
            if sealed != dict(spec.environment_variables):
                spec = dataclasses.replace(spec, environment_variables=sealed)
            out.append((spec, salt, secret))
        return out

    # --- submitting -------------------------------------------------------------------

    def submit_function(self, spec: JobSpec, func: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: Mapping[str, Any], *,
                        files: Mapping[str, bytes] | None = None) -> JobRecord:
        """Pickle, record, store and launch. Nothing is recorded if pickling fails."""
        requirements = (_read_file(spec.dependencies, "dependencies")
                        if spec.dependencies and "env/requirements.txt" not in (files or {})
                        else None)
        script = (_read_file(spec.pre_execution_script, "pre_execution_script")
                  if spec.pre_execution_script else None)
        self._check_submission()
        spec, salt, secret = self._new_secret(spec)
        key = payload_key(secret)
        # An isolated environment cannot import the caller's own (uninstalled) modules.
        isolated = spec.dependencies or spec.conda_env
        by_value = _local_modules(func) if isolated else ()
        fn_payload = serialize(func, key, what=f"function {spec.function_name!r}",
                               by_value=by_value)
        arg_payload = serialize((tuple(args), dict(kwargs)), key,
                                what=f"arguments of {spec.function_name!r}")
        record = self.metadata.create_job(spec, key_salt=salt, backend=self.backend.name)
        try:
            self.put_payloads(spec.name, {"function": fn_payload, "arguments": arg_payload})
            if requirements is not None:
                self.artifacts.put_bytes(job_key(spec.name, "env", "requirements.txt"),
                                         requirements)
            if script is not None:
                self.artifacts.put_bytes(job_key(spec.name, "env", "pre_exec.sh"), script)
            for rel, data in (files or {}).items():
                self.artifacts.put_bytes(job_key(spec.name, *rel.split("/")), data)
        except ShoalError as e:
            self.transition(spec.name, JobStatus.FAILED, failure_kind=FailureKind.INTERNAL,
                            reason=f"could not store the payloads of job {spec.name}: {e}")
            raise
        return self.launch(record, secret)

    def submit_script(self, spec: JobSpec, files: Mapping[str, bytes | Path], *,
                      on_file: Callable[[str, int], None] | None = None) -> JobRecord:
        """Record a script job, store its files (bytes, or a local file to upload), launch.
        *on_file* is told each file's relative key and size once it is stored."""
        self._check_submission()
        spec, salt, secret = self._new_secret(spec)
        record = self.metadata.create_job(spec, key_salt=salt, backend=self.backend.name)
        try:
            for rel, data in files.items():
                key = job_key(spec.name, *rel.split("/"))
                if isinstance(data, Path):
                    try:
                        self.artifacts.put_file(key, data)
                    except OSError as e:  # a local file that went, or cannot be read
                        raise ArtifactStoreError(f"cannot read {data}: {e}", key=key) from e
                else:
                    self.artifacts.put_bytes(key, data)
                if on_file is not None:
                    on_file(rel, data.stat().st_size if isinstance(data, Path) else len(data))
        except ShoalError as e:
            self.transition(spec.name, JobStatus.FAILED, failure_kind=FailureKind.INTERNAL,
                            reason=f"could not store the files of job {spec.name}: {e}")
            raise
        return self.launch(record, secret)

    def submit_batch(self, specs: Sequence[JobSpec], func: Callable[..., Any],
                     calls: Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]]) -> JobBatch:
        """Many calls of *func* at once, each its own job (record, key, log, result), handed
        to one warm worker together. The specs must differ only in their names.

        Raises (recording nothing) when a payload cannot be pickled or the records cannot be
        created; once they are, a failure to store the payloads or to start a worker fails the
        jobs instead (their outcomes say why).
        """
        from shoal.jobs._batchfiles import new_batch_id, write_batch
        from shoal.jobs.batchclient import JobBatch

        self._check_submission()
        template = specs[0]
        sealed = self._new_secrets(specs)
        keys = [payload_key(secret) for _, _, secret in sealed]
        # Pickled once: each job gets the same pickle signed under its own key.
        function = serialize(func, keys[0], what=f"function {template.function_name!r}")
        arguments = [serialize((tuple(args), dict(kwargs)), key,
                               what=f"arguments of {template.function_name!r}")
                     for key, (args, kwargs) in zip(keys, calls, strict=True)]
        batch = new_batch_id(self._clock.now())
        if isinstance(self.backend, BatchLauncher):
            return self._launch_batch_at_once(self.backend, batch, specs, sealed, function,
                                              arguments, keys)
        records, secrets = self._create_batch(batch, specs, sealed)
        names = tuple(r.name for r in records)
        signed = keys
        keys = [payload_key(secret) for secret in secrets]
        # A name that was taken was drawn again, with a new key: its arguments signed again.
        arguments = [a if k == was else resign(a, k)
                     for a, k, was in zip(arguments, keys, signed, strict=True)]
        try:
            write_batch(self.artifacts, batch, function,
                        [(n, resign(function, k), a)
                         for n, k, a in zip(names, keys, arguments, strict=True)],
                        known=self._functions)
        except ShoalError as e:
            self.advance_many([JobChange(n, JobStatus.FAILED, failure_kind=FailureKind.INTERNAL,
                                         reason=f"could not store the payloads of batch "
                                                f"{batch}: {e}") for n in names])
            return JobBatch(self, names, keys, None)
        ctx = self._batch_context(batch, template, names, secrets)
        try:
            info = self.backend.launch(ctx)
        except ShoalError as e:
            self.advance_many([JobChange(n, JobStatus.FAILED, failure_kind=FailureKind.INTERNAL,
                                         reason=f"could not start the supervisor: {e}")
                               for n in names])
            return JobBatch(self, names, keys, None)
        if info.waiter is None:  # a new supervisor: it records its handle itself too
            self.metadata.set_handles(names, info.to_json())
        logger.info("batch %s of %d jobs submitted (supervisor: %s)", batch, len(names),
                    supervisor_words(info.to_json()))
        return JobBatch(self, names, keys, info, ctx)

    def _batch_context(self, batch: str, template: JobSpec, names: Sequence[str],
                       secrets: Sequence[str]) -> ExecContext:
        """What starts (or hands over to) the supervisor of a batch."""
        keep = template.keep_alive_period_in_seconds
        return ExecContext(job=JobName(batch), entrypoint=self._entrypoint,
                           args=(batch, *names),
                           env=self._handover_env(dict(zip(names, secrets, strict=True))),
                           prepare=self._prepare,
                           pool=self._spec_pool_key(template, template.name) if keep else None,
                           keep_alive_seconds=keep, cpus=template.cpus, gpus=template.gpus,
                           memory_mib=template.memory_mib, batch=tuple(names))

    def _launch_batch_at_once(self, launcher: BatchLauncher, batch: str,
                              specs: Sequence[JobSpec],
                              sealed: Sequence[tuple[JobSpec, str, str]], function: Payload,
                              arguments: Sequence[Payload], signed: Sequence[str]) -> JobBatch:
        """``submit_batch`` through a backend that records, stores and launches in one call
        (a team server): the records, the batch's files and the launch go together."""
        from shoal.errors import AlreadyExistsError
        from shoal.jobs._batchfiles import batch_files
        from shoal.jobs.batchclient import JobBatch

        template = specs[0]
        specs, sealed = list(specs), list(sealed)
        attempts = 0
        while True:
            placed = [(dataclasses.replace(s, batch=BatchRef(batch, i)), salt, secret)
                      for i, (s, salt, secret) in enumerate(sealed)]
            names = tuple(s.name for s, _, _ in placed)
            secrets = [secret for _, _, secret in placed]
            keys = [payload_key(secret) for secret in secrets]
            # A name that was taken was drawn again, with a new key: its arguments signed again.
            signed_args = [a if k == was else resign(a, k)
                           for a, k, was in zip(arguments, keys, signed, strict=True)]
            files, sha = batch_files(batch, function,
                                     [(n, resign(function, k), a) for n, k, a in
                                      zip(names, keys, signed_args, strict=True)],
                                     known=self._functions)
            ctx = self._batch_context(batch, template, names, secrets)
            try:
                _, info, why = launcher.create_and_launch(
                    [s for s, _, _ in placed], key_salts=[salt for _, salt, _ in placed],
                    files=files, ctx=ctx)
                break
            except AlreadyExistsError as e:
                taken = set(e.details.get("jobs") or ())
                attempts += 1
                if attempts == 5 or not taken:
                    raise
                self._redraw(specs, sealed, taken)
        if info is None:
            logger.warning("batch %s of %d jobs failed at its launch: %s", batch, len(names),
                           why)
            return JobBatch(self, names, keys, None)
        self._functions.add(sha)
        logger.info("batch %s of %d jobs submitted (supervisor: %s)", batch, len(names),
                    supervisor_words(info.to_json()))
        return JobBatch(self, names, keys, info, ctx)

    def _redraw(self, specs: list[JobSpec], sealed: list[tuple[JobSpec, str, str]],
                taken: set[str]) -> None:
        """Draw again the generated names in *taken* (six random hex digits per second of
        names), each with a new salt and secret (in place)."""
        import secrets

        for i, spec in enumerate(specs):
            if spec.name in taken:
                specs[i] = spec = dataclasses.replace(spec, name=JobName(
                    f"{spec.name.rsplit('-', 1)[0]}-{secrets.token_hex(3)}"))
                sealed[i] = self._new_secret(spec)

    def _create_batch(self, batch: str, specs: Sequence[JobSpec],
                      sealed: Sequence[tuple[JobSpec, str, str]]
                      ) -> tuple[list[JobRecord], list[str]]:
        """Record a batch's jobs (*sealed*: each spec sealed, its salt and secret), each naming
        its batch, and return them with their secrets; a generated name that is taken (six
        random hex digits per second of names) is drawn again, with a new salt and secret."""
        import secrets

        from shoal.errors import AlreadyExistsError

        def in_batch(spec: JobSpec, i: int) -> JobSpec:
            return dataclasses.replace(spec, batch=BatchRef(batch, i))

        specs = list(specs)
        sealed = [(in_batch(s, i), salt, secret) for i, (s, salt, secret) in enumerate(sealed)]
        attempts = 0
        while True:
            try:
                records = self.metadata.create_jobs([s for s, _, _ in sealed],
                                                    key_salts=[salt for _, salt, _ in sealed],
                                                    backend=self.backend.name)
                return records, [secret for _, _, secret in sealed]
            except AlreadyExistsError as e:
                taken = set(e.details.get("jobs") or ())
                attempts += 1
                if attempts == 5 or not taken:
                    raise
                for i, spec in enumerate(specs):
                    if spec.name in taken:
                        specs[i] = spec = dataclasses.replace(spec, name=JobName(
                            f"{spec.name.rsplit('-', 1)[0]}-{secrets.token_hex(3)}"))
                        new, salt, secret = self._new_secret(spec)
                        sealed[i] = (in_batch(new, i), salt, secret)

    def _handover_env(self, secrets: Mapping[str, str]) -> dict[str, str]:
        """The supervisor's environment: the session's, and the secrets of its jobs alone."""
        return {**self._env, JOB_SECRETS_VAR: encode_handover(secrets)}

    def launch(self, record: JobRecord, secret: str | None = None) -> JobRecord:
        """Start the supervisor of a recorded job (*secret*: the job's, if known already)."""
        spec = record.spec
        keep = spec.keep_alive_period_in_seconds
        if secret is None:
            secret = self.job_secret(record.name)
        ctx = ExecContext(job=record.name, entrypoint=self._entrypoint, args=(record.name,),
                          env=self._handover_env({record.name: secret}), prepare=self._prepare,
                          pool=self._pool_key(record) if keep else None,
                          keep_alive_seconds=keep, cpus=spec.cpus, gpus=spec.gpus,
                          memory_mib=spec.memory_mib, hosts=ranks_of(spec).hosts)
        try:
            info = self.backend.launch(ctx)
        except ShoalError as e:
            return self.transition(record.name, JobStatus.FAILED,
                                   failure_kind=FailureKind.INTERNAL,
                                   reason=f"could not start the supervisor: {e}")
        if info.waiter is not None:
            # A warm worker records its own handle when it takes the job: one write fewer.
            self._waiters[record.name] = info.waiter
        else:
            self.metadata.set_handle(record.name, info.to_json())
        logger.info("job %s submitted (supervisor: %s)", record.name,
                    supervisor_words(info.to_json()),
                    extra={"job_id": record.name})
        return record

    def _check_submission(self) -> None:
        # A backend on other machines checks, before anything is recorded, that they reach
        # the stores (a clear error instead of a job that fails on a node).
        self.backend.check_submission(self._env)

    def _pool_key(self, record: JobRecord) -> str:
        return self._spec_pool_key(record.spec, record.name)

    def _spec_pool_key(self, spec: JobSpec, name: str) -> str:
        """Jobs that may share a warm worker: same environment, workdir and stores."""
        import hashlib

        parts = [spec.python_version, spec.workdir.sha256 if spec.workdir else "",
                 spec.conda_env or "", str(spec.memory_mib),
                 self._env.get("SHOAL_METADATA_URL", ""), self._env.get("SHOAL_ARTIFACT_URL", "")]
        if spec.dependencies:
            parts.append(self.artifacts.get_bytes(
                job_key(name, "env", "requirements.txt")).decode(errors="replace"))
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def put_payloads(self, job: str, payloads: Mapping[str, Payload]) -> None:
        """Store job *job*'s payloads (``{kind: Payload}``): small ones in the metadata store,
        large ones as files (``jobs/_payloads.py``)."""
        store_payloads(self.metadata, self.artifacts, job, payloads)

    def put_payload(self, job: str, kind: str, payload: Payload) -> None:
        """Store one payload of job *job* (``put_payloads``)."""
        self.put_payloads(job, {kind: payload})

    def get_payload(self, job: str, kind: str) -> Payload:
        try:
            return load_payload(self.metadata, self.artifacts, job, kind)
        except ArtifactNotFound:
            # A batched job's payloads live in its batch (jobs/_batchfiles.py).
            from shoal.jobs._batchfiles import find_outcome, job_payload

            ref = self.metadata.get_job(job).spec.batch
            if ref is None:
                raise
            batch = ref.id
            if kind in ("function", "arguments"):
                return job_payload(self.artifacts, batch, job, kind)
            found = find_outcome(self.artifacts, batch, job)
            if found is None or found[0] != kind:
                raise
            return found[1]

    # --- state ------------------------------------------------------------------------

    def advance(self, name: str, status: JobStatus, **fields: Any) -> None:
        """transition() without reading the record back (the supervisor's hot path)."""
        self.metadata.update_job(name, status=status, want_record=False, **fields)
        logger.info("job %s is %s", name, status, extra={"job_id": name})
        if status.is_terminal:
            self._wake([name])

    def advance_many(self, changes: Sequence[JobChange], *,
                     files: Mapping[str, bytes] | None = None) -> list[bool]:
        """Several transitions in one transaction (a batch's jobs); which were applied.
        *files* (artifact key -> bytes: a batch's outcomes) are stored first; through a team
        server, in the same request (``OutcomeRecorder``)."""
        if files and isinstance(self.metadata, OutcomeRecorder):
            applied = self.metadata.update_jobs_with_files(changes, files)
        else:
            for key, data in (files or {}).items():
                self.artifacts.put_bytes(key, data)
            applied = self.metadata.update_jobs(changes) if changes else []
        self.applied(changes, applied)
        return applied

    def applied(self, changes: Sequence[JobChange], applied: Sequence[bool]) -> None:
        """After *changes* were recorded (*applied*: which), elsewhere too (a warm worker's
        claimer): log them and wake this host's clients waiting on the jobs that ended."""
        for change, ok in zip(changes, applied, strict=True):
            if ok:
                logger.info("job %s is %s", change.name, change.status,
                            extra={"job_id": change.name})
        self._wake([c.name for c, ok in zip(changes, applied, strict=True)
                    if ok and c.status.is_terminal])

    def transition(self, name: str, status: JobStatus, **fields: Any) -> JobRecord:
        record = self.metadata.update_job(name, status=status, **fields)
        if record is None:  # want_record defaults to True; a store that ignores it is broken
            record = self.metadata.get_job(name)
        if status == JobStatus.FAILED:
            logger.info("job %s failed: %s", name, fields.get("reason"), extra={"job_id": name})
        else:
            logger.info("job %s is %s", name, status, extra={"job_id": name})
        if status.is_terminal:
            self._wake([name])
        return record

    def _wake(self, names: list[str]) -> None:
        """Wake the clients on this host that wait for *names* (their ends are committed)."""
        if names and self._wake_dir is not None:
            notify(self._wake_dir, names)

    def get(self, name: str) -> JobRecord:
        return self.metadata.get_job(name)

    def read_log(self, name: str, offset: int = 0) -> bytes:
        try:
            return self.artifacts.read_range(log_key(name), offset)
        except ArtifactNotFound:
            return b""

    def log_uri(self, name: str) -> str:
        return self.artifacts.uri(log_key(name))

    # --- waiting ----------------------------------------------------------------------

    def wait(self, name: str, *, timeout: float | None = None,
             on_output: Callable[[bytes], None] | None = None,
             on_status: Callable[[JobRecord], None] | None = None) -> JobRecord:
        """Block until *name* ends; stream its log to *on_output*, report each new status to
        *on_status*. TimeoutError on *timeout*."""
        try:
            return self._wait(name, timeout, on_output, on_status)
        finally:
            record_done = name not in self._waiters
            if not record_done and self._waiters[name].done:
                self._waiters.pop(name).close()

    def _wait(self, name: str, timeout: float | None,
              on_output: Callable[[bytes], None] | None,
              on_status: Callable[[JobRecord], None] | None) -> JobRecord:
        waiter = self._waiters.get(name)
        if waiter is not None and on_output is None and on_status is None:
            # A warm worker says when the job has ended: block on that, then read the record.
            # (for a while at a time: a cluster that stops answering is noticed below)
            waiter.wait(timeout if timeout is not None else _WAITER_SLICE_S)
        wake = None  # bound before the first read of the record
        if waiter is None and self._wake_dir is not None and self._ends is None:
            wake = open_channel(self._wake_dir, name)
        try:
            return self._poll(name, timeout, on_output, on_status, waiter, wake)
        finally:
            if wake is not None:
                wake.close()

    def _poll(self, name: str, timeout: float | None,
              on_output: Callable[[bytes], None] | None,
              on_status: Callable[[JobRecord], None] | None, waiter: JobWaiter | None,
              wake: WakeChannel | None) -> JobRecord:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay, offset, cap = 0.001, 0, 0.05
        next_log = next_liveness = time.monotonic()
        last_status = None
        while True:
            record = self.metadata.get_job(name)
            if on_status is not None and record.status != last_status:
                last_status = record.status
                on_status(record)
            now = time.monotonic()
            streamed = self._ends is not None and not record.is_terminal
            if on_output is not None and not streamed and (record.is_terminal or
                                                           now >= next_log):
                chunk = self.read_log(name, offset)
                if chunk:
                    offset += len(chunk)
                    on_output(chunk)
                next_log = now + 0.1
            if record.is_terminal:
                if waiter is not None:
                    waiter.close()
                    self._waiters.pop(name, None)
                return record
            if now >= next_liveness:
                self._reap_one(record)
                self._check_answering(record)
                next_liveness = now + 0.5
            if deadline is not None and now >= deadline:
                raise TimeoutError(f"job {name} is still {record.status} after {timeout} s")
            if self._ends is not None and (waiter is None or on_output is not None):
                # The server answers when the job ends (or streams its log until then).
                window = 1.0 if on_status is not None else _WAITER_SLICE_S  # to see statuses
                if deadline is not None:
                    window = max(0.0, min(window, deadline - now))
                if on_output is not None:
                    offset = self._ends.follow_log(name, offset, on_output, window)
                else:
                    self._ends.wait(name, window)
                continue
            if waiter is not None and not waiter.done:
                # A warm worker tells us when the job ends: no polling needed meanwhile.
                waiter.wait(0.1 if on_output is not None else 0.5)
                continue
            if wake is not None:
                # A supervisor on this host wakes us when it records the end, so the record
                # is read less often; one elsewhere (Ray, a shared home) cannot: poll as usual.
                if self.backend.name == "local" and record.handle.get("host") in (None, _HOST):
                    cap = 0.1 if on_output is not None else 0.25
                wake.wait(delay)
            else:
                time.sleep(delay)  # bounded polling of the durable record
            delay = min(delay * 1.5, cap)

    def _check_answering(self, record: JobRecord) -> None:
        """While waiting: a backend that has not answered for ``backend_wait_seconds`` ends
        the wait (the job is left as it is; waiting again later picks it up)."""
        since = self._unanswered_since
        if since is None or time.monotonic() - since < self.backend_wait_seconds:
            return
        cause = self.liveness_unknown
        address = cause.details.get("address") if cause is not None else None
        raise BackendUnavailableError(
            f"stopped waiting for job {record.name} (recorded {record.status}): the "
            f"{self.backend.name} backend{f' at {address!r}' if address else ''} has not "
            f"answered for {int(self.backend_wait_seconds)} s ({cause}). Wait again once it "
            "answers; the job's record and log stay readable ('shoal jobs describe "
            f"{record.name}')", job=record.name, address=address)

    def outcome(self, record: JobRecord) -> Any:
        """The job's return value, or the matching exception."""
        name = record.name
        if record.status == JobStatus.COMPLETED:
            return deserialize(self.get_payload(name, "results"), self.payload_key(name),
                               what=f"result of job {name}", reader="client")
        if record.status == JobStatus.STOPPED:
            raise JobCancelledError(f"job {name} was stopped before it finished", job=name)
        if not record.is_terminal:
            raise InvalidTransitionError(f"job {name} is still {record.status}", job=name)
        failure = JobFailedError(
            f"job {name} failed: {(record.failure_reason or '').rstrip('.')}. "
            f"Log: {self.log_uri(name)}",
            job=name, log_uri=self.log_uri(name), reason=record.failure_reason)
        if record.failure_kind == FailureKind.TIMEOUT:
            raise JobTimeoutError(f"job {name}: {record.failure_reason}", job=name,
                                  log_uri=self.log_uri(name))
        if record.failure_kind == FailureKind.USER_ERROR:
            self._raise_user_exception(record, failure)
        raise failure

    def _raise_user_exception(self, record: JobRecord, failure: JobFailedError) -> None:
        try:
            key = self.payload_key(record.name)
        except PayloadIntegrityError as e:  # recorded before keys were derived: say what failed
            raise failure from e
        try:
            info = deserialize(self.get_payload(record.name, "exception"), key,
                               what=f"exception of job {record.name}", reader="client")
        except ArtifactNotFound:
            raise failure from None
        exc = info.get("exception")
        tb = info.get("traceback", "")
        if isinstance(exc, BaseException):
            exc.add_note(f"\nRemote traceback (job {record.name}):\n{tb}")
            raise exc from failure
        raise JobFailedError(
            f"job {record.name} raised {info.get('type')}: {info.get('message')} (the exception "
            f"could not be pickled). Remote traceback:\n{tb}", job=record.name,
            log_uri=self.log_uri(record.name), traceback=tb, exception_type=info.get("type"))

    # --- stopping and reaping -------------------------------------------------------------

    def cancel(self, name: str) -> JobRecord:
        """Ask a job to stop (SIGTERM, then SIGKILL after its grace period)."""
        record = self.metadata.get_job(name)
        if record.is_terminal:
            return record
        if record.status != JobStatus.STOPPING:
            try:
                record = self.transition(name, JobStatus.STOPPING, reason="stop requested")
            except InvalidTransitionError:
                return self.metadata.get_job(name)  # it ended meanwhile
        alive = self.backend.is_alive(record.handle)
        if alive:
            self.backend.signal_stop(record.handle)
        elif alive is False:
            record = self.transition(name, JobStatus.STOPPED, reason="stopped (supervisor gone)")
        return record

    def reap(self) -> list[JobName]:
        """Fail (or retry) every unfinished job whose supervisor is gone; return their names.
        A backend that does not answer leaves the rest as they are, their liveness unknown
        (``liveness_unknown`` says why)."""
        reaped = []
        self.liveness_unknown = None
        for record in self.metadata.iter_unfinished():
            if self._reap_one(record):
                reaped.append(record.name)
            if self.liveness_unknown is not None:
                break  # one bounded wait for a backend that is down, not one per job
        return reaped

    def _is_alive(self, handle: Mapping[str, Any]) -> bool | None:
        """The backend's answer; None (unknown) while it does not answer, which is noted in
        ``liveness_unknown`` (and when it began, for ``wait``)."""
        try:
            alive = self.backend.is_alive(handle)
        except BackendUnavailableError as e:
            self.liveness_unknown = e
            if self._unanswered_since is None:
                self._unanswered_since = time.monotonic()
            return None
        self._unanswered_since = None
        return alive

    def _reap_one(self, record: JobRecord) -> bool:
        if record.is_terminal:
            return False
        orphaned = why_orphaned(record, self.backend, self._is_alive, self._clock.now())
        if orphaned is None:
            return False
        reason, kind = orphaned
        current = self.metadata.get_job(record.name)
        if current.is_terminal or current.handle != record.handle:
            return False  # it ended, or a supervisor took it meanwhile
        if RELAUNCH not in current.handle and may_relaunch(current) and self.keys is not None:
            return relaunch(self, current, reason, kind)  # infrastructure lost: another attempt
        status = JobStatus.STOPPED if current.status == JobStatus.STOPPING else JobStatus.FAILED
        try:
            self.transition(record.name, status, failure_kind=kind, reason=reason)
        except InvalidTransitionError:
            return False
        return True
