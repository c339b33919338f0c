"""The supervisor of one job: slot, environment, child process, log, result, end state.

It runs detached from the client (forked by the local launcher or as its own interpreter),
so a job outlives the process that submitted it. The user's code runs in a child process
(``shoal.jobs._entrypoint``) that it watches, times out, stops and reports on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shoal.core.jobs import FailureKind, JobKind, JobRecord, JobSpec, JobStatus
from shoal.core.ports import HandedTake, WarmWorkerEndpoint
from shoal.core.secrets import mask_text
from shoal.errors import InvalidTransitionError, ShoalError, StorageError
from shoal.jobs._descendants import (
    become_subreaper,
    descendants,
    end_descendants,
    not_subreaper,
)
from shoal.jobs._outcomes import Outcome, conclude
from shoal.jobs._prepare import JobPython, PrepareError, Preparer
from shoal.jobs._process import (
    ExecProcess,
    ForkedProcess,
    JobProcess,
    WarmExecutor,
    ZygoteProcess,
    ensure_zygote,
    killpg,
)
from shoal.jobs._training import (
    CHECKPOINT_SYNC_SECONDS,
    CheckpointTap,
    TrainingAttempt,
    ranks_of,
)
from shoal.jobs.keys import JOB_SECRETS_VAR, encode_handover, secret_values_seen, take_handover
from shoal.jobs.logsink import LogSink, StdoutSink
from shoal.jobs.service import JobService, log_key
from shoal.jobs.slots import SlotPool
from shoal.jobs.workfiles import drop_copies
from shoal.serialization.keys import payload_key

__all__ = ["Outcome", "Supervisor"]

logger = logging.getLogger(__name__)
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: Variables of the supervisor's own environment that never reach a job's process.
_NOT_INHERITED = ("SHOAL_JOB_KEY", JOB_SECRETS_VAR)


def hidden_values(spec: JobSpec) -> tuple[str, ...]:
    """The secret values a job of *spec* can see here (``keys.secret_values_seen``)."""
    return secret_values_seen(spec.environment_variables, os.environ)


class Supervisor:
    def __init__(self, service: JobService, *, work_root: Path, slots: SlotPool,
                 python: str | None = None, cpu_count: int | None = None,
                 fork: bool = True, envs: Any = None, warm: bool = False,
                 run_dir: Path | None = None, zygote_idle_seconds: float = 300.0,
                 checkpoint_sync_seconds: float = CHECKPOINT_SYNC_SECONDS) -> None:
        self._svc = service
        self._work_root = Path(work_root)
        self._slots = slots
        self._python = python or sys.executable
        self._cores = cpu_count or os.cpu_count() or 1
        self._stop = False
        self._current: str | None = None
        self._retire_after = False
        self._stop_spent = False  # a stop signal stopped the current job (begin resets it)
        # A warm worker serves many jobs: a SIGTERM stops the current one only if its record
        # says a stop was asked for (a late signal must not hit the next job).
        self._warm = warm
        self._run_dir = run_dir
        self._executor: WarmExecutor | None = None
        self._zygote_idle = zygote_idle_seconds
        self._checkpoint_sync = checkpoint_sync_seconds
        # Fork the job from this clean, single-threaded process when it runs on our own
        # interpreter (saves a Python start-up and the cloudpickle import); exec otherwise.
        self._fork = fork and self._python == sys.executable
        self._preparer = Preparer(service.artifacts, envs=envs, python=self._python,
                                  fork=self._fork, payloads=service.get_payload)
        self._plan = JobPython(self._python, fork=self._fork)
        self._wake_r, self._wake_w = -1, -1
        self._subreaper = False  # adopts what the job's processes orphan (install_signals)
        self._before: frozenset[int] = frozenset()  # what ran under us before (install_signals)
        # Sees the output of a script job as it streams; syncs a job's checkpoints meanwhile.
        self._tap: TrainingAttempt | CheckpointTap | None = None
        self._hidden: tuple[str, ...] = ()  # the current job's secret values (masked)
        #: called once, just before the next job's end is recorded
        self.before_finish: Callable[[], None] | None = None

    # --- what a batch (``_batchrun.py``) runs through ------------------------------------

    @property
    def service(self) -> JobService:
        return self._svc

    @property
    def work_root(self) -> Path:
        return self._work_root

    @property
    def wake_fd(self) -> int:
        """Readable when a signal arrived (``signal.set_wakeup_fd``); drain with
        ``drain_wakeups``."""
        return self._wake_r

    def drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 512)

    def begin(self, job: str | None) -> None:
        """Before a job (or a batch: *job* None) is taken: signals handled, no stop pending,
        and a later stop signal checked against *job*'s record."""
        self.install_signals()
        self._stop = False
        self._stop_spent = False
        self._current = job

    @property
    def signalled(self) -> bool:
        """A stop signal arrived that nothing has acted on yet."""
        return self._stop

    def take_signal(self) -> bool:
        """Whether a stop signal arrived since the last call (and clear it)."""
        signalled, self._stop = self._stop, False
        return signalled

    def retire_later(self, why: str) -> None:
        """A stop signal that no job asked for: finish what runs, then retire (a warm worker
        serves no further job)."""
        if not self._retire_after:
            sys.stderr.write(f"[shoal] warm supervisor pid {os.getpid()}: {why}; it retires "
                             "after this job\n")
        self._retire_after = True

    def acquire_slot(self) -> bool:
        """Wait for a slot of this machine; False when a stop signal came first."""
        return self._slots.acquire(lambda: self._stop) is not None

    def release_slot(self) -> None:
        self._slots.release()

    def prepare_batch(self, record: JobRecord, workdir: Path, sink: LogSink) -> dict[str, str]:
        """Prepare the environment, code and directory the calls of a batch like *record*
        share; return their process environment (each call gets its own key)."""
        self._plan = self._preparer.prepare(record, workdir, sink, inline_ok=True)
        env = self._child_env(record.spec, "", record.name)
        env.pop("SHOAL_JOB_KEY", None)
        return env

    def executor_for(self, spec: JobSpec) -> WarmExecutor:
        """The persistent executor, started (again) when there is none fit for *spec*."""
        return self._executor_for(spec)

    def close(self) -> None:
        """End the persistent executor, if any (this process is done with jobs)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.close()

    def forget_executor(self) -> None:
        """The executor died (its caller reaped it): the next job starts a fresh one."""
        self._executor = None

    # --- signals ----------------------------------------------------------------------

    def install_signals(self, stop: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
                        ) -> None:
        """Take *stop* as stop signals (once per process), wake the watch loops on any
        signal, and adopt what the job's processes orphan."""
        if self._wake_r >= 0:
            return
        # Orphans of the job (a setsid child whose parent exited, a double fork) come to us,
        # not to init: end_leftovers() ends them with the job.
        self._subreaper = become_subreaper()
        # What ran under this process before it supervised (a process that supervises in
        # place, as a test does): not the job's, left alone with all it starts.
        self._before = frozenset(descendants()) if self._subreaper else frozenset()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        signal.set_wakeup_fd(self._wake_w)

        def on_term(signum: int, frame: Any) -> None:
            self._stop = True

        for sig in stop:
            signal.signal(sig, on_term)

    # --- the job ----------------------------------------------------------------------

    def run(self, name: str) -> int:
        self.begin(name)
        self._svc.hand_over(take_handover(os.environ))  # before any job code runs
        self._hidden = ()
        record = self._svc.get(name)
        if record.status == JobStatus.STOPPING:
            self._svc.transition(name, JobStatus.STOPPED, reason="stopped before it started")
            return 0
        if record.status != JobStatus.PENDING:
            logger.warning("job %s is %s; nothing to supervise", name, record.status)
            return 0
        if self._warm:  # a warm worker was handed this job: say who supervises it, now
            self._svc.metadata.set_handle(name, self.own_handle())
        try:
            record = self._svc.unseal(record)  # its secret variables, decrypted
        except ShoalError as e:
            self._finish(name, Outcome(JobStatus.FAILED, FailureKind.INTEGRITY, str(e)))
            return 1
        self._hidden = hidden_values(record.spec)
        if self._slots.acquire(lambda: self._stop) is None:
            self._finish(name, Outcome(JobStatus.STOPPED, reason="stopped while queued"))
            return 0
        try:
            self._attempts(record)
            if self._warm:
                # The signal that stopped this job is spent, and the worker serves on; one
                # that came as the job ended (its client may already have the result) retires
                # the worker, as one while it is idle does.
                if self._stop and not self._stop_spent and not self._asked_to_stop(name):
                    self.retire_later(f"a stop signal came as job {name} ended")
                self._stop = False
        except Exception as e:  # a store failure or a shoal bug: never leave the job running
            logger.exception("supervisor of job %s failed", name)
            # A store's error names the store; its traceback is in the supervisor's log.
            said = str(e) if isinstance(e, StorageError) else \
                f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
            with contextlib.suppress(Exception):
                self._finish(name, Outcome(JobStatus.FAILED, FailureKind.INTERNAL,
                                           f"the supervisor failed: {said}"))
            return 1
        finally:
            self._slots.release()
        return 0

    def _attempts(self, record: JobRecord) -> None:
        spec = record.spec
        sink = LogSink(self._svc.artifacts, log_key(record.name),
                       self._work_root / f"{record.name}.log", redact=self._hidden)
        attempts = max(1, spec.max_retry_attempts)
        # A supervisor started for a later attempt (its predecessor lost: jobs/relaunch.py)
        # goes on from there, after the log the earlier attempts wrote.
        first = min(record.attempt + 1, attempts)
        if first > 1:
            sink.resume()
        try:
            for attempt in range(first, attempts + 1):
                if attempt > 1:
                    sink.write(f"[shoal] attempt {attempt} of {attempts}\n".encode())
                outcome = self._attempt(record, attempt, sink)
                # Its outcome is stored: the copies in its work directory only take space.
                drop_copies(self._work_root / f"{record.name}.{attempt}",
                            script=spec.kind == JobKind.SCRIPT,
                            uploaded=outcome.status == JobStatus.COMPLETED, empty=True)
                if outcome.retry and attempt < attempts and not self._stop:
                    try:
                        self._svc.transition(record.name, JobStatus.PENDING,
                                             reason=mask_text(f"attempt {attempt} failed: "
                                                              f"{outcome.reason}; retrying",
                                                              self._hidden))
                        continue
                    except InvalidTransitionError:  # a stop was asked for meanwhile
                        outcome = Outcome(JobStatus.STOPPED, reason="stopped on request")
                sink.close()
                self._finish(record.name, outcome)
                return
        finally:
            sink.close()

    def _finish(self, name: str, outcome: Outcome) -> None:
        hook, self.before_finish = self.before_finish, None
        if hook is not None:  # e.g. a warm worker becoming claimable before its job's end shows
            hook()
        if outcome.reason and self._hidden:  # a reason may quote a secret value: masked
            outcome = Outcome(outcome.status, outcome.kind, mask_text(outcome.reason,
                                                                      self._hidden),
                              outcome.exit_code, outcome.retry)
        if outcome.status == JobStatus.COMPLETED:  # the common case: no read first
            try:
                self._svc.advance(name, JobStatus.COMPLETED, exit_code=outcome.exit_code)
                return
            except InvalidTransitionError:
                pass  # a stop was asked for meanwhile; settle it below
        current = self._svc.get(name).status
        status = outcome.status
        if current == JobStatus.STOPPING and status == JobStatus.FAILED \
                and outcome.kind == FailureKind.SIGNAL:
            status = JobStatus.STOPPED
        if current.is_terminal:
            logger.warning("job %s already ended %s; not recording %s", name, current, status)
            return
        if status == JobStatus.STOPPED and current != JobStatus.STOPPING:
            # A stop that came from a signal rather than a request: record the way down.
            self._svc.transition(name, JobStatus.STOPPING, reason=outcome.reason)
        self._svc.transition(name, status, reason=outcome.reason, failure_kind=outcome.kind,
                             exit_code=outcome.exit_code)

    def _attempt(self, record: JobRecord, attempt: int, sink: LogSink) -> Outcome:
        name, spec = record.name, record.spec
        try:  # only a pending job starts: a stop asked for while it queued wins
            self._svc.advance(name, JobStatus.STARTING, expected=JobStatus.PENDING,
                                 attempt=attempt)
        except InvalidTransitionError:
            return Outcome(JobStatus.STOPPED, reason="stopped before it started")
        workdir = self._work_root / f"{name}.{attempt}"
        if attempt > 1 or workdir.exists():
            shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        t0 = time.monotonic()
        try:
            # A warm executor gets the payloads on its socket: no files to write for it.
            self._plan = self._preparer.prepare(record, workdir, sink, inline_ok=self._warm
                                                and ranks_of(spec).world == 1)
            env = self._child_env(spec, payload_key(self._svc.job_secret(name)), name)
            self._preparer.pre_execute(record, self._plan, env, workdir, sink,
                                       lambda: self._stop)
            training = self._training_for(record, workdir, sink, attempt)
            tap = training or self._checkpoint_tap(record, workdir, sink)
            if spec.checkpoint_s3_uri and tap is not None and tap.checkpoints:
                # The function's CheckpointLocation is this directory (remote_function).
                env.update(SHOAL_CHECKPOINT_DIR=str(tap.checkpoints.local),
                           SHOAL_CHECKPOINT_URI=tap.checkpoints.uri)
        except PrepareError as e:
            return Outcome(JobStatus.FAILED, e.kind, e.reason)
        setup = time.monotonic() - t0
        if self._stop:
            return Outcome(JobStatus.STOPPED, reason="stopped while starting")
        try:
            if training is not None:
                # A script, or several ranks: the SageMaker layout and SM_* contract.
                proc: JobProcess = training.start(self._plan.python, env, spec.memory_mib)
            elif self._plan.runtime is not None and self._run_dir is not None:
                # An isolated interpreter: fork the job from that interpreter's warm zygote.
                with not_subreaper():  # the zygote serves other jobs: never our orphan
                    sock = ensure_zygote(self._plan.python, (self._plan.runtime,),
                                         self._run_dir, self._zygote_idle)
                proc = ZygoteProcess.start(sock, {
                    "workdir": str(workdir), "env": env, "memory_mib": spec.memory_mib,
                    "grace_seconds": spec.stop_grace_period_in_seconds,
                    "pythonpath": [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]})
            elif self._plan.fork and self._warm:
                # A warm pool runs its jobs in one persistent executor (reset between jobs).
                proc = self._executor_for(spec).run(workdir, env, self._payload_blobs(name))
            elif self._plan.fork:
                proc = ForkedProcess.start(workdir, env, spec.memory_mib,
                                           close_fds=(self._wake_r, self._wake_w))
            else:
                proc = ExecProcess.start(self._plan.python, workdir, env, spec.memory_mib)
        except OSError as e:
            return Outcome(JobStatus.FAILED, FailureKind.INTERNAL,
                           f"cannot start the job process ({self._plan.python}): {e}",
                           retry=True)
        try:
            self._svc.advance(name, JobStatus.RUNNING, expected=JobStatus.STARTING,
                              env_setup_seconds=round(setup, 6))
        except InvalidTransitionError:
            # A stop was asked for while the job started: its SIGTERM reaches _watch, which
            # stops the process and records the job stopped.
            self._stop = True
        self._tap = tap
        try:
            rc, stopped, timed_out = self._watch(proc, spec, sink)
        finally:
            self._tap = None
            if tap is not None:
                # The output has ended: stored now, before the tap's last metrics flush,
                # which waits out a metadata store that is away (the log stays readable).
                sink.end()
                sink.flush()
                tap.close()
        if training is not None and rc != 0 and not (stopped or timed_out) and (
                lost := training.lost_hosts()):
            return Outcome(JobStatus.FAILED, FailureKind.NODE_LOST,
                           f"another host of the job was lost mid-job, and its other ranks "
                           f"were stopped: {lost}", exit_code=rc, retry=True)
        return conclude(self._svc, record, workdir, rc, sink, stopped=stopped,
                        timed_out=timed_out, training=training,
                        inline=getattr(proc, "inline", None))

    def _training_for(self, record: JobRecord, workdir: Path, sink: LogSink, attempt: int
                      ) -> TrainingAttempt | None:
        spec = record.spec
        if spec.kind != JobKind.SCRIPT and ranks_of(spec).world == 1:
            return None
        training = TrainingAttempt(record, workdir, sink, artifacts=self._svc.artifacts,
                                   metadata=self._svc.metrics, cores=self._cores,
                                   attempt=attempt,
                                   checkpoint_sync_seconds=self._checkpoint_sync)
        # What the launchers of the job's other hosts (a cluster's nodes) start from: the
        # supervisor's environment, with this job's secret handed on (and no other's).
        training.supervisor_env = {**os.environ,
                                   JOB_SECRETS_VAR: encode_handover(
                                       {record.name: self._svc.job_secret(record.name)})}
        training.setup()
        return training

    def _checkpoint_tap(self, record: JobRecord, workdir: Path, sink: LogSink
                        ) -> CheckpointTap | None:
        """A function job that took a CheckpointLocation: its checkpoints, synced from here."""
        if not record.spec.checkpoint_s3_uri:
            return None
        tap = CheckpointTap(record, workdir, sink, interval=self._checkpoint_sync)
        tap.setup()
        return tap

    def run_host(self, name: str, attempt: int, host_index: int, master_addr: str,
                 master_port: int) -> int:
        """Run the ranks of host *host_index* of a job placed on several nodes, on this node:
        prepare the job's environment and directory here as for its first host, then hand
        over to the rank launcher (which takes this process's place). Its output (this host's
        preparation, then its ranks' lines) goes to stdout, which the first host's supervisor
        streams into the job's log; the job's state stays that supervisor's to record."""
        self._svc.hand_over(take_handover(os.environ))  # before any job code runs
        record = self._svc.get(name)
        host = f"algo-{host_index + 1}"
        try:
            record = self._svc.unseal(record)
        except ShoalError as e:
            sys.stdout.write(f"[shoal] {host} cannot run job {name}: {e}\n")
            return 1
        # A LogSink's write and tail, on stdout (the first host's supervisor redacts again).
        out: Any = StdoutSink(hidden_values(record.spec))
        if record.status.is_terminal or record.status == JobStatus.STOPPING:
            out.write(f"[shoal] {host}: job {name} is {record.status}; not starting\n".encode())
            return 1
        workdir = self._work_root / f"{name}.{attempt}.{host}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        self.install_signals()
        try:
            self._plan = self._preparer.prepare(record, workdir, out, inline_ok=False)
            env = self._child_env(record.spec, payload_key(self._svc.job_secret(name)), name)
            self._preparer.pre_execute(record, self._plan, env, workdir, out,
                                       lambda: self._stop)
            training = TrainingAttempt(record, workdir, out, artifacts=self._svc.artifacts,
                                       metadata=self._svc.metrics, cores=self._cores,
                                       attempt=attempt)
            training.setup()
        except PrepareError as e:
            out.write(f"[shoal] {host} could not prepare job {name}: {e.reason}\n".encode())
            return 1
        # A stop from here on must reach the rank launcher: held until it has its handlers
        # (the mask survives execve; _ranks unblocks it).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        if self._stop:
            return 128 + signal.SIGTERM
        plan = {"grace_seconds": record.spec.stop_grace_period_in_seconds,
                "ranks": training.host_plans(self._plan.python, env, host_index, master_addr,
                                             master_port)}
        plan_file = workdir / "ranks.json"
        plan_file.write_text(json.dumps(plan))
        out.close()  # what its redactor held back, then flushed
        signal.set_wakeup_fd(-1)
        launcher_env = {k: v for k, v in env.items() if k != "SHOAL_JOB_KEY"}
        launcher_env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        os.execve(sys.executable, [sys.executable, "-m", "shoal.jobs._ranks", str(plan_file)],
                  launcher_env)
        return 70  # not reached

    def run_batch(self, batch: str, names: Sequence[str], *,
                  notify: Callable[[dict[str, Any], bytes], None] | None = None,
                  take: HandedTake | None = None,
                  claimer: WarmWorkerEndpoint | None = None) -> int:
        """Run jobs handed over together (``JobService.submit_batch``), each its own job;
        *notify* tells the client which ended (``jobs/_batchrun.py``). *take*: what the
        claimer handed over with the batch (``ExecContext.take``); the *claimer* (the
        worker's endpoint) then records the handle and the jobs' changes."""
        from shoal.jobs._batchrun import BatchRun

        self._svc.hand_over(take_handover(os.environ))  # before any job code runs
        handed = None if take is None or claimer is None else (take, claimer)
        return BatchRun(self, batch, names, notify, handed).run()

    def _child_env(self, spec: JobSpec, secret: str, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        threads = str(max(1, min(int(spec.cpus or self._cores), self._cores)))
        local = spec.instance_type in (None, "local")
        for var in _THREAD_VARS:
            # The instance type decides; environment_variables may override, and on "local"
            # (this machine, as the caller runs) a limit the caller set stays.
            if not (local and var in env):
                env[var] = threads
        plan = self._plan
        # An isolated environment sees only shoal's runtime, not the client's packages.
        sys_path = list(plan.pythonpath)
        if plan.isolated:
            env.pop("PYTHONPATH", None)
        else:  # the client's own interpreter: its import path too, as in the notebook
            sys_path += [p for p in spec.sys_path if p]
        if sys_path:
            env["PYTHONPATH"] = os.pathsep.join([*sys_path, env.get("PYTHONPATH", "")]).rstrip(
                os.pathsep)
        env.update(spec.environment_variables)
        env.update({"SHOAL_JOB_NAME": name, "SHOAL_JOB_KEY": secret, "PYTHONUNBUFFERED": "1"})
        if plan.cwd is not None:
            env["SHOAL_JOB_CWD"] = str(plan.cwd)
        if spec.run:  # the experiment run the caller had open: load_run() in the job finds it
            env["SHOAL_RUN_CONTEXT"] = json.dumps(spec.run.to_json(), sort_keys=True)
        return env

    # --- watching ---------------------------------------------------------------------

    def _watch(self, proc: JobProcess, spec: JobSpec, sink: LogSink) -> tuple[int, bool, bool]:
        out_fd = proc.out_fd
        os.set_blocking(out_fd, False)
        sel = selectors.DefaultSelector()
        sel.register(out_fd, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        for fd in proc.extra_fds():  # e.g. a warm executor's "job done" channel
            sel.register(fd, selectors.EVENT_READ, "extra")
        deadline = time.monotonic() + spec.max_runtime_in_seconds
        kill_at: float | None = None
        stopped = timed_out = eof = done = False
        while not done:
            now = time.monotonic()
            if self._stop and self._warm and not self._stop_confirmed():
                # A SIGTERM nobody asked for through the job: finish this job, then retire.
                self._stop = False
                self.retire_later("a stop signal came, but job "
                                  f"{self._current} was not asked to stop")
            if self._stop and not stopped and not timed_out:
                stopped = True
                self._stop_spent = True  # the signal that stopped this job
                killpg(proc.pid, signal.SIGTERM)
                kill_at = now + spec.stop_grace_period_in_seconds
            if not timed_out and not stopped and now >= deadline:
                timed_out = True
                killpg(proc.pid, signal.SIGKILL)
            if kill_at is not None and now >= kill_at:
                killpg(proc.pid, signal.SIGKILL)
                kill_at = None
            # After EOF the process may live on (it closed its stdout): poll it briefly, so
            # the deadline and stop requests still apply.
            waits = [deadline - now, sink.next_flush(now) - now, 0.01 if eof else 1.0]
            if self._tap is not None:
                waits.append(self._tap.next_tick(now) - now)
            if kill_at is not None:
                waits.append(kill_at - now)
            for key, _ in sel.select(max(0.0, min(waits))):
                if key.fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 512)
                    continue
                if key.data == "extra":
                    continue  # proc.poll() below reads it
                if self._drain(out_fd, sink):
                    eof = True
                    sel.unregister(out_fd)
            sink.maybe_flush(time.monotonic())
            if self._tap is not None:
                self._tap.tick(time.monotonic())
            if proc.poll() is not None:
                if not eof:  # a grandchild may still hold the pipe: take what is there
                    self._drain(out_fd, sink)
                done = True
        sel.close()
        rc = proc.wait()
        proc.finish()  # kill leftovers of the job's process group, close the pipe
        self.end_leftovers(spec.stop_grace_period_in_seconds)
        return rc, stopped, timed_out

    def end_leftovers(self, grace: float) -> None:
        """End every process the job left, in its session or not (SIGTERM, then SIGKILL
        after *grace*): all our descendants but the warm executor itself."""
        if self._subreaper:
            spare = (self._executor.pid,) if self._executor is not None and \
                self._executor.alive else ()
            end_descendants(grace, spare, keep=self._before)

    def _executor_for(self, spec: JobSpec) -> WarmExecutor:
        if self._executor is None or not self._executor.usable(spec.memory_mib):
            if self._executor is not None:
                self._executor.close()
            self._executor = WarmExecutor.start(spec.memory_mib,
                                                close_fds=(self._wake_r, self._wake_w))
        return self._executor

    def _payload_blobs(self, name: str) -> list[bytes]:
        blobs: list[bytes] = []
        for kind in ("function", "arguments"):
            payload = self._svc.get_payload(name, kind)
            blobs += [payload.data, payload.metadata]
        return blobs

    def stop_requested(self) -> bool:
        """A SIGTERM arrived that did not stop a job: a warm worker then retires."""
        return self._stop or self._retire_after

    @staticmethod
    def own_handle() -> dict[str, Any]:
        """What the job's record says about its supervisor: this process (and, for a
        supervisor a cluster backend started, what that backend finds it by)."""
        import socket

        from shoal.backends.procfs import start_ticks

        handle = {"backend": "local", "pid": os.getpid(), "host": socket.gethostname(),
                  "start_ticks": start_ticks(os.getpid())}
        # A supervisor a cluster backend started (a Ray warm actor's) is found through it.
        given = os.environ.get("SHOAL_SUPERVISOR_HANDLE")
        if given:
            handle.update(json.loads(given))
        return handle

    def _asked_to_stop(self, name: str) -> bool:
        """Whether *name*'s record says a stop was asked for (its stop signal is spent)."""
        return self._svc.get(name).status in (JobStatus.STOPPING, JobStatus.STOPPED)

    def _stop_confirmed(self) -> bool:
        if self._current is None:
            return False
        return self._svc.get(self._current).status == JobStatus.STOPPING

    def _drain(self, fd: int, sink: LogSink) -> bool:
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return False
            if not data:
                return True
            sink.write(data)
            if self._tap is not None:
                self._tap.on_output(data)
