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
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.core.jobs import FailureKind, JobRecord, JobSpec, JobStatus
from shoal.errors import ShoalError
from shoal.jobs._entrypoint import EXIT_OK, EXIT_RAISED, EXIT_REFUSED
from shoal.jobs.logsink import LogSink
from shoal.jobs.service import JobService, log_key
from shoal.jobs.slots import SlotPool
from shoal.storage.artifacts import job_key

__all__ = ["Outcome", "Supervisor"]

logger = logging.getLogger(__name__)
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True, slots=True)
class _JobPython:
    """Which interpreter runs the job, and how it starts."""

    python: str
    fork: bool
    pythonpath: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    status: JobStatus
    kind: FailureKind | None = None
    reason: str | None = None
    exit_code: int | None = None
    retry: bool = False


class Supervisor:
    def __init__(self, service: JobService, *, work_root: Path, slots: SlotPool,
                 python: str | None = None, cpu_count: int | None = None,
                 fork: bool = True, envs: Any = None) -> None:
        self._svc = service
        self._work_root = Path(work_root)
        self._slots = slots
        self._python = python or sys.executable
        self._cores = cpu_count or os.cpu_count() or 1
        self._stop = False
        # Fork the job from this clean, single-threaded process when it runs on our own
        # interpreter (saves a Python start-up and the cloudpickle import); exec otherwise.
        self._fork = fork and self._python == sys.executable
        self._envs = envs  # an UvEnvBuilder, for jobs with dependencies
        self._plan = _JobPython(self._python, fork=self._fork)
        self._wake_r, self._wake_w = -1, -1

    # --- signals ----------------------------------------------------------------------

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        signal.set_wakeup_fd(self._wake_w)

        def on_term(signum: int, frame: Any) -> None:
            self._stop = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)

    # --- the job ----------------------------------------------------------------------

    def run(self, name: str) -> int:
        self._install_signals()
        record = self._svc.get(name)
        if record.status == JobStatus.STOPPING:
            self._svc.transition(name, JobStatus.STOPPED, reason="stopped before it started")
            return 0
        if record.status != JobStatus.PENDING:
            logger.warning("job %s is %s; nothing to supervise", name, record.status)
            return 0
        if self._slots.acquire(lambda: self._stop) is None:
            self._finish(name, Outcome(JobStatus.STOPPED, reason="stopped while queued"))
            return 0
        try:
            self._attempts(record)
        except Exception as e:  # a store failure or a shoal bug: never leave the job running
            logger.exception("supervisor of job %s failed", name)
            with contextlib.suppress(Exception):
                self._finish(name, Outcome(JobStatus.FAILED, FailureKind.INTERNAL,
                                           f"the supervisor failed: {type(e).__name__}: {e}\n"
                                           f"{traceback.format_exc(limit=5)}"))
            return 1
        finally:
            self._slots.release()
        return 0

    def _attempts(self, record: JobRecord) -> None:
        spec = record.spec
        sink = LogSink(self._svc.artifacts, log_key(record.name),
                       self._work_root / record.name / "output.log")
        attempts = max(1, spec.max_retry_attempts)
        try:
            for attempt in range(1, attempts + 1):
                if attempt > 1:
                    sink.write(f"[shoal] attempt {attempt} of {attempts}\n".encode())
                outcome = self._attempt(record, attempt, sink)
                if outcome.retry and attempt < attempts and not self._stop:
                    self._svc.transition(record.name, JobStatus.PENDING,
                                         reason=f"attempt {attempt} failed: {outcome.reason}; "
                                                "retrying")
                    continue
                sink.close()
                self._finish(record.name, outcome)
                return
        finally:
            sink.close()

    def _finish(self, name: str, outcome: Outcome) -> None:
        current = self._svc.get(name).status
        status = outcome.status
        if current == JobStatus.STOPPING and status == JobStatus.FAILED \
                and outcome.kind == FailureKind.SIGNAL:
            status = JobStatus.STOPPED
        if current == JobStatus.PENDING and status == JobStatus.STOPPED:
            self._svc.transition(name, JobStatus.STOPPING, reason=outcome.reason)
        self._svc.transition(name, status, reason=outcome.reason, failure_kind=outcome.kind,
                             exit_code=outcome.exit_code)

    def _attempt(self, record: JobRecord, attempt: int, sink: LogSink) -> Outcome:
        name, spec = record.name, record.spec
        self._svc.transition(name, JobStatus.STARTING, attempt=attempt)
        workdir = self._work_root / name / f"attempt-{attempt}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        t0 = time.monotonic()
        problem = self._prepare(record, workdir, sink)
        setup = time.monotonic() - t0
        if problem is not None:
            return problem
        if self._stop:
            return Outcome(JobStatus.STOPPED, reason="stopped while starting")
        env = self._child_env(spec, self._svc.metadata.get_job_secret(name), name)
        try:
            if self._plan.fork:
                proc: _Process = _ForkedProcess.start(workdir, env, spec.memory_mib,
                                                      close_fds=(self._wake_r, self._wake_w))
            else:
                proc = _ExecProcess.start(self._plan.python, workdir, env, spec.memory_mib)
        except OSError as e:
            return Outcome(JobStatus.FAILED, FailureKind.INTERNAL,
                           f"cannot start the job process ({self._plan.python}): {e}",
                           retry=True)
        self._svc.transition(name, JobStatus.RUNNING, env_setup_seconds=round(setup, 6))
        rc, stopped, timed_out = self._watch(proc, spec, sink)
        return self._conclude(record, workdir, rc, stopped, timed_out, sink)

    def _prepare(self, record: JobRecord, workdir: Path, sink: LogSink) -> Outcome | None:
        spec = record.spec
        if spec.python_version and spec.python_version != _python_version():
            return Outcome(JobStatus.FAILED, FailureKind.VERSION,
                           f"the client runs Python {spec.python_version} but the job would run "
                           f"Python {_python_version()}; client and job major.minor must match")
        plan = _JobPython(self._python, fork=self._fork)
        if spec.dependencies:
            try:
                plan = self._build_env(record, sink)
            except ShoalError as e:
                return Outcome(JobStatus.FAILED, FailureKind.ENVIRONMENT,
                               f"the environment for {spec.dependencies} could not be built: {e}")
        self._plan = plan
        for kind in ("function", "arguments"):
            target = workdir / kind
            target.mkdir()
            payload = self._svc.get_payload(record.name, kind)
            (target / "payload.pkl").write_bytes(payload.data)
            (target / "metadata.json").write_bytes(payload.metadata)
        return None

    def _build_env(self, record: JobRecord, sink: LogSink) -> _JobPython:
        import cloudpickle

        from shoal.envs import ensure_runtime

        spec = record.spec
        if self._envs is None:
            raise ShoalError(f"job {record.name} asks for dependencies but this supervisor has "
                             "no environment builder")
        text = self._svc.artifacts.get_bytes(job_key(record.name, "env", "requirements.txt"))
        built = self._envs.ensure(
            text.decode(), base_dir=Path(spec.dependencies or ".").parent,
            extra=(f"cloudpickle=={cloudpickle.__version__}",),
            log=lambda msg: sink.write(msg.encode()))
        self._svc.artifacts.put_bytes(job_key(record.name, "env", "requirements.lock"),
                                      built.lock.encode())
        sink.write(f"[shoal] environment {built.key[:12]} "
                   f"({'cached' if built.cached else 'built'}) in {built.seconds:.2f} s\n".encode())
        runtime = ensure_runtime(self._envs.root.parent / "runtime")
        return _JobPython(str(built.python), fork=False, pythonpath=(str(runtime),))

    def _child_env(self, spec: JobSpec, secret: str, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SHOAL_JOB_KEY"}
        threads = str(max(1, min(int(spec.cpus or self._cores), self._cores)))
        for var in _THREAD_VARS:
            env.setdefault(var, threads)
        plan = self._plan
        # An isolated environment sees only shoal's runtime, not the client's packages.
        sys_path = list(plan.pythonpath) if plan.pythonpath else [
            p for p in spec.extra.get("sys_path", []) if p]
        if plan.pythonpath:
            env.pop("PYTHONPATH", None)
        if sys_path:
            env["PYTHONPATH"] = os.pathsep.join([*sys_path, env.get("PYTHONPATH", "")]).rstrip(
                os.pathsep)
        env.update(spec.environment_variables)
        env.update({"SHOAL_JOB_NAME": name, "SHOAL_JOB_KEY": secret, "PYTHONUNBUFFERED": "1"})
        if spec.extra.get("cwd"):
            env["SHOAL_JOB_CWD"] = str(spec.extra["cwd"])
        return env

    # --- watching ---------------------------------------------------------------------

    def _watch(self, proc: _Process, spec: JobSpec, sink: LogSink) -> tuple[int, bool, bool]:
        out_fd = proc.out_fd
        os.set_blocking(out_fd, False)
        sel = selectors.DefaultSelector()
        sel.register(out_fd, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        deadline = time.monotonic() + spec.max_runtime_in_seconds
        kill_at: float | None = None
        stopped = timed_out = eof = False
        while not eof:
            now = time.monotonic()
            if self._stop and not stopped and not timed_out:
                stopped = True
                _killpg(proc.pid, signal.SIGTERM)
                kill_at = now + spec.stop_grace_period_in_seconds
            if not timed_out and not stopped and now >= deadline:
                timed_out = True
                _killpg(proc.pid, signal.SIGKILL)
            if kill_at is not None and now >= kill_at:
                _killpg(proc.pid, signal.SIGKILL)
                kill_at = None
            waits = [deadline - now, sink.next_flush(now) - now, 1.0]
            if kill_at is not None:
                waits.append(kill_at - now)
            for key, _ in sel.select(max(0.0, min(waits))):
                if key.fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 512)
                    continue
                eof = self._drain(out_fd, sink)
            sink.maybe_flush(time.monotonic())
            if not eof and proc.poll() is not None:
                # The child is gone; a grandchild may still hold the pipe. Take what is there.
                self._drain(out_fd, sink)
                eof = True
        sel.close()
        rc = proc.wait()
        _killpg(proc.pid, signal.SIGKILL)  # leftovers of the job's process group
        os.close(out_fd)
        return rc, stopped, timed_out

    @staticmethod
    def _drain(fd: int, sink: LogSink) -> bool:
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return False
            if not data:
                return True
            sink.write(data)

    def _conclude(self, record: JobRecord, workdir: Path, rc: int, stopped: bool,
                  timed_out: bool, sink: LogSink) -> Outcome:
        name, spec = record.name, record.spec
        if stopped:
            return Outcome(JobStatus.STOPPED, reason="stopped on request", exit_code=rc)
        if timed_out:
            return Outcome(JobStatus.FAILED, FailureKind.TIMEOUT,
                           f"exceeded max_runtime_in_seconds={spec.max_runtime_in_seconds}; "
                           "the job was killed (SIGKILL)", exit_code=rc)
        if rc == EXIT_OK and (workdir / "results" / "metadata.json").exists():
            self._upload(name, workdir, "results")
            return Outcome(JobStatus.COMPLETED, exit_code=0)
        if rc == EXIT_RAISED and (workdir / "exception" / "metadata.json").exists():
            self._upload(name, workdir, "exception")
            summary = _read_json(workdir / "exception" / "summary.json")
            return Outcome(JobStatus.FAILED, FailureKind.USER_ERROR,
                           f"{summary.get('type', 'exception')}: {summary.get('message', '')}",
                           exit_code=rc)
        if rc == EXIT_REFUSED and (workdir / "shoal_error.json").exists():
            err = _read_json(workdir / "shoal_error.json")
            kind = FailureKind(err.get("kind", FailureKind.INTERNAL))
            return Outcome(JobStatus.FAILED, kind, str(err.get("message")), exit_code=rc)
        if rc < 0:
            sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
            return Outcome(JobStatus.FAILED, FailureKind.SIGNAL,
                           f"the job process was killed by signal {sig} ({-rc}), which shoal "
                           "did not send (out of memory, or killed from outside)",
                           exit_code=rc, retry=True)
        return Outcome(JobStatus.FAILED, FailureKind.EXIT_CODE,
                       f"the job process exited with code {rc}; last output:\n"
                       f"{sink.tail(20)}", exit_code=rc)

    def _upload(self, name: str, workdir: Path, kind: str) -> None:
        arts = self._svc.artifacts
        arts.put_bytes(job_key(name, kind, "payload.pkl"),
                       (workdir / kind / "payload.pkl").read_bytes())
        arts.put_bytes(job_key(name, kind, "metadata.json"),
                       (workdir / kind / "metadata.json").read_bytes())


class _Process:
    pid: int
    out_fd: int

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self) -> int:
        raise NotImplementedError


class _ExecProcess(_Process):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._p = popen
        self.pid = popen.pid
        if popen.stdout is None:  # Popen(stdout=PIPE) always sets it
            raise RuntimeError("job process has no output pipe")
        self.out_fd = os.dup(popen.stdout.fileno())
        popen.stdout.close()

    @classmethod
    def start(cls, python: str, workdir: Path, env: dict[str, str],
              memory_mib: int | None) -> _ExecProcess:
        return cls(subprocess.Popen(
            [python, "-m", "shoal.jobs._entrypoint", str(workdir)],
            env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_limits(memory_mib)))  # noqa: PLW1509 - the supervisor is single-threaded

    def poll(self) -> int | None:
        return self._p.poll()

    def wait(self) -> int:
        return self._p.wait()


class _ForkedProcess(_Process):
    def __init__(self, pid: int, out_fd: int) -> None:
        self.pid, self.out_fd = pid, out_fd
        self._rc: int | None = None

    @classmethod
    def start(cls, workdir: Path, env: dict[str, str], memory_mib: int | None,
              close_fds: tuple[int, ...]) -> _ForkedProcess:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child; its effects are tested
            code = 70
            try:
                os.close(r)
                code = _run_forked_child(workdir, env, memory_mib, w, close_fds)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        os.close(w)
        return cls(pid, r)

    def poll(self) -> int | None:
        if self._rc is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._rc = os.waitstatus_to_exitcode(status)
        return self._rc

    def wait(self) -> int:
        if self._rc is None:
            _, status = os.waitpid(self.pid, 0)
            self._rc = os.waitstatus_to_exitcode(status)
        return self._rc


def _run_forked_child(workdir: Path, env: dict[str, str], memory_mib: int | None, out: int,
                      close_fds: tuple[int, ...]) -> int:
    import io

    os.setsid()
    signal.set_wakeup_fd(-1)
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(devnull)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    _limits(memory_mib)()
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    os.chdir(workdir)
    from shoal.jobs._entrypoint import main as entry

    return entry([str(workdir)])


def _python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _limits(memory_mib: int | None) -> Any:
    def apply() -> None:
        import ctypes
        import resource

        # Die with the supervisor: a job never outlives the process that records its end.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if memory_mib:
            limit = memory_mib * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply
