"""An endpoint's supervisor: one detached process that keeps its model servers running.

It stages the model once (``_staging.py``), builds the model's own environment when it asks
for one, starts ``instance_count`` server processes (``python -m shoal.serving``) on
127.0.0.1 and marks the endpoint InService once all of them serve. The instances share one
port, the endpoint's one address: each binds it with ``SO_REUSEPORT`` (``--reuse-port``) and
listens only once its model is loaded, so the kernel spreads connections over the loaded,
living ones and an instance that dies or is still loading gets none. An instance tells it is
loaded by writing its port file; the supervisor holds a bound, never-listening socket of the
group so that the port stays the endpoint's while instances restart. (An LLM server cannot
share its port: each of its instances gets its own, as before, and ``Predictor`` spreads
requests over them.) A server that dies is restarted on the same port after a bounded
backoff (restarts are counted on the record). SIGTERM, or the record moving to Deleting, stops them
all and removes the record. An instance that never becomes healthy fails the endpoint with
the end of its output (a traceback, usually) and its log is kept in the artifact store under
``endpoints/<name>/logs/``.

The servers die with the supervisor (PR_SET_PDEATHSIG), so no orphan keeps a port.

``SupervisedEndpoints`` is the client's side: the ``EndpointBackend`` that launches a
supervisor through the session's backend, tells whether it still runs, and stops it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.backends import BACKENDS
from shoal.core.endpoints import (
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
    InstanceStatus,
    RuntimeState,
    RuntimeView,
    endpoint_dir,
    endpoint_key,
)
from shoal.core.jobs import JobName
from shoal.core.ports import Backend, EndpointStore, ExecContext
from shoal.core.secrets import without_credentials
from shoal.endpoints._staging import (
    code_requirements,
    requirements_base,
    server_requirements,
    serving_pythonpath,
    stage_model,
)
from shoal.errors import ArtifactNotFound, EndpointNotFound, InvalidTransitionError, ShoalError
from shoal.jobs.relaunch import supervisor_words

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["EndpointSupervisor", "SupervisedEndpoints", "main"]

HOST = "127.0.0.1"
ENTRY = "shoal.endpoints._supervisor:main"
SERVER_MODULE = "shoal.serving"
#: What the model server imports, pinned to the client's versions in a model's own env.
SERVER_DISTRIBUTIONS = ("uvicorn", "httptools", "uvloop", "numpy", "onnxruntime",
                        "prometheus-client", "fsspec", "rich", "orjson")
MAX_BACKOFF_S = 30.0
#: An instance that fails to come back this many times in a row fails the endpoint.
MAX_FAILED_STARTS = 5
_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


class _Failed(Exception):
    """The endpoint cannot be served; the message is its failure reason."""


@dataclass
class _Instance:
    index: int
    #: None until the server has bound a free port of its choosing (and written it down).
    port: int | None
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    status: InstanceStatus = InstanceStatus.PENDING
    restarts: int = 0
    failed_starts: int = 0
    deadline: float = 0.0
    restart_at: float | None = None
    pings: int = field(default=0)

    @property
    def port_file(self) -> Path:
        return self.log.with_suffix(".port")

    def record(self) -> EndpointInstance:
        pid = self.proc.pid if self.proc is not None else None
        return EndpointInstance(self.index, HOST, self.port or 0, pid, self.status,
                                self.restarts)

    def read_port(self) -> int | None:
        """The port the server bound (it writes the file once it listens)."""
        if self.port is None:
            try:
                self.port = int(self.port_file.read_text().strip())
            except (OSError, ValueError):
                return None
        return self.port


def _die_with_parent() -> None:
    """In the server's child process: get SIGTERM when the supervisor dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            s.bind((HOST, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-16384:]
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").rstrip().splitlines()[-lines:])


def _echo(message: str) -> None:
    """What the environment builder says, into the supervisor's log (its stdout)."""
    sys.stdout.write(message)


class EndpointSupervisor:
    def __init__(self, session: Session, name: str) -> None:
        self._session = session
        self._store: EndpointStore = session.metadata
        self._name = name
        self._dir = endpoint_dir(session.home, name)
        self._stopping = False  # set by SIGTERM; a flag, as a handler must not take locks
        self._startup_timeout = 600.0
        self._fixed_port: int | None = None
        self._instances: list[_Instance] = []
        self._argv: list[str] = []
        self._env: dict[str, str] = {}
        self._cwd: Path | None = None
        self._client: Any = None
        #: the instances share one port (not an LLM); the socket that keeps it theirs
        self._shared = False
        self._reserved: socket.socket | None = None

    def _say(self, message: str) -> None:
        sys.stdout.write(f"[shoal] endpoint {self._name}: {message}\n")
        sys.stdout.flush()

    def request_stop(self, *_: Any) -> None:
        self._stopping = True

    def _pause(self, seconds: float) -> bool:
        """Sleep a little (a signal cuts it short); True when asked to stop."""
        if not self._stopping:
            time.sleep(seconds)
        return self._stopping

    # --- the whole life ---------------------------------------------------------------

    def run(self) -> int:
        import httpx

        record = self._store.find_endpoint(self._name)
        if record is None or record.status != EndpointStatus.CREATING:
            self._say("nothing to do (deleted, or not Creating)")
            return 0
        self._client = httpx.Client(timeout=2.0)
        try:
            try:
                self._prepare(record)
                self._start_all(record)
                if not self._stopping:
                    self._store.update_endpoint(self._name, status=EndpointStatus.IN_SERVICE,
                                                expected=EndpointStatus.CREATING)
                    ports = dict.fromkeys(str(i.port) for i in self._instances)
                    self._say(f"InService on {', '.join(ports)}")
                    self._watch()
            except _Failed as e:
                self._fail(str(e))
                return 1
            except (EndpointNotFound, InvalidTransitionError):
                self._say("deleted while running; stopping")
            except Exception as e:  # a bug here must still leave a record that says so
                import traceback

                self._fail(f"the endpoint's supervisor failed: {type(e).__name__}: {e}\n"
                           f"{traceback.format_exc()}")
                raise
            self._shutdown(remove=True)
            return 0
        finally:
            self._kill_all()
            self._client.close()
            if self._reserved is not None:
                self._reserved.close()

    def _fail(self, reason: str) -> None:
        import shutil

        self._say(f"failed: {reason}")
        self._kill_all()
        self._upload_logs()
        # A failed endpoint serves nothing: free the disk its staged model held now (the
        # logs stay until 'shoal endpoints delete' removes the endpoint's directory).
        shutil.rmtree(self._dir / "model", ignore_errors=True)
        (self._dir / "code.tar.gz").unlink(missing_ok=True)
        with contextlib.suppress(EndpointNotFound, InvalidTransitionError):
            self._store.update_endpoint(self._name, status=EndpointStatus.FAILED,
                                        failure_reason=reason)
            self._store.remove_endpoint_instances(self._name)

    # --- preparing --------------------------------------------------------------------

    def _prepare(self, record: EndpointRecord) -> None:
        import shutil

        cfg = record.config
        self._startup_timeout = float(cfg.startup_timeout_s)
        self._fixed_port = cfg.port
        if self._dir.exists():
            shutil.rmtree(self._dir, ignore_errors=True)
        (self._dir / "logs").mkdir(parents=True)
        artifacts = self._session.artifacts
        try:
            code_archive = None
            if cfg.code:
                code_archive = self._dir / "code.tar.gz"
                artifacts.get_file(endpoint_key(self._name, "code", "code.tar.gz"), code_archive)
            model_dir = stage_model(record.model_data, self._dir / "model",
                                    code_archive=code_archive)
            requirements = None
            if cfg.requirements:
                requirements = artifacts.get_bytes(
                    endpoint_key(self._name, "env", "requirements.txt")).decode()
        except (ShoalError, OSError) as e:
            if isinstance(e, ArtifactNotFound):
                raise _Failed(f"the deployer's code or requirements are missing: {e}") from e
            raise _Failed(str(e)) from e
        python, pythonpath = self._environment(model_dir, requirements)
        self._cwd = model_dir
        self._argv = [python, "-m", SERVER_MODULE, "--model", str(model_dir), "--host", HOST]
        if cfg.batching is not None:
            self._argv += ["--max-batch-size", str(cfg.batching.max_batch_size),
                           "--max-batch-delay-ms", f"{cfg.batching.max_batch_delay_ms:g}"]
        # The client's environment, less shoal's own settings: the server reads none of them.
        # An endpoint a team server started gets none of the server's credentials either:
        # its inference code is its deployer's (SHOAL_ENDPOINT_CREDENTIALS=withhold).
        env = {k: v for k, v in self._session.supervisor_env().items()
               if not k.startswith("SHOAL_")}
        if self._session.settings.endpoint_credentials == "withhold":
            env = without_credentials(env)
        env.update(cfg.env)
        if cfg.entry_point:
            env.setdefault("SAGEMAKER_PROGRAM", "inference.py")
        env["PYTHONPATH"] = os.pathsep.join(
            [pythonpath, *filter(None, [env.get("PYTHONPATH")])])
        env["PYTHONUNBUFFERED"] = "1"
        self._shared = not (model_dir / "serving.properties").is_file()  # not an LLM
        if self._shared and cfg.instance_count > 1:
            # A model server starts a worker per CPU unless told; instances on one host
            # share the CPUs, so each takes its part (model_server_workers still decides).
            env.setdefault("SHOAL_MODEL_SERVER_WORKERS",
                           str(max(1, _usable_cpus() // cfg.instance_count)))
        self._env = env
        if self._shared:
            shared = self._reserve_port(cfg.port)
            self._instances = [_Instance(index, shared, self._dir / "logs" /
                                         f"instance-{index}.log")
                               for index in range(cfg.instance_count)]
            return
        for index in range(cfg.instance_count):
            port = cfg.port + index if cfg.port is not None else None
            if port is not None and _port_in_use(port):
                raise _Failed(f"port {port} on {HOST} (instance {index}) is already in use; "
                              "choose another port, or leave port unset to use free ones")
            self._instances.append(_Instance(index, port, self._dir / "logs" /
                                             f"instance-{index}.log"))

    def _reserve_port(self, port: int | None) -> int:
        """The endpoint's port (*port*, or a free one), held by a bound socket that never
        listens: no other process can take it while the instances (re)start."""
        if port is not None and _port_in_use(port):
            raise _Failed(f"port {port} on {HOST} is already in use; choose another port, or "
                          "leave port unset to use a free one")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((HOST, port or 0))
        except OSError as e:
            sock.close()
            raise _Failed(f"cannot bind port {port or 0} on {HOST} with SO_REUSEPORT, which "
                          f"the endpoint's instances share: {e}") from e
        self._reserved = sock
        return int(sock.getsockname()[1])

    def _environment(self, model_dir: Path, requirements: str | None) -> tuple[str, str]:
        """The interpreter and PYTHONPATH entry the servers run with."""
        here = str(serving_pythonpath(Path(self._session.home) / "envs" / "serving-runtime"))
        wanted = [text for text in (requirements, code_requirements(model_dir)) if text]
        if not wanted:
            return sys.executable, here
        self._say("building the model's environment")
        try:
            built = self._session.env_builder.ensure(
                "\n".join(wanted), base_dir=requirements_base(model_dir),
                extra=server_requirements(SERVER_DISTRIBUTIONS, wanted),
                log=_echo)
        except ShoalError as e:
            raise _Failed(f"the model's environment could not be built: {e}") from e
        self._say(f"environment {built.key[:12]} ({'cached' if built.cached else 'built'})")
        return str(built.python), here

    # --- running instances ------------------------------------------------------------

    def _launch(self, inst: _Instance) -> None:
        inst.log.parent.mkdir(parents=True, exist_ok=True)
        inst.port_file.unlink(missing_ok=True)
        # Port 0 lets the server bind a free port itself (no race with another process); a
        # restart asks for the same port again, so the instance keeps its address.
        argv = [*self._argv, "--port", str(inst.port or 0), "--port-file", str(inst.port_file)]
        if self._shared:
            argv.append("--reuse-port")  # it writes the port file once it listens
        with open(inst.log, "ab") as log:
            inst.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self._env, cwd=self._cwd, preexec_fn=_die_with_parent)
        inst.status = InstanceStatus.PENDING if inst.restarts == 0 else InstanceStatus.RESTARTING
        inst.deadline = time.monotonic() + self._startup_timeout
        inst.restart_at = None
        self._store.put_endpoint_instance(self._name, inst.record())
        self._say(f"instance {inst.index} started (pid {inst.proc.pid}, port "
                  f"{inst.port or 'of its choosing'})")

    def _healthy(self, inst: _Instance) -> bool:
        if self._shared:  # its /ping is not its own to reach: it says when it listens
            return inst.port_file.exists()
        port = inst.read_port()
        if port is None:
            return False
        try:
            return bool(self._client.get(f"http://{HOST}:{port}/ping").status_code == 200)
        except Exception:  # not listening yet, or busy loading: not healthy yet
            return False

    def _start_all(self, record: EndpointRecord) -> None:
        for inst in self._instances:
            self._launch(inst)
        delay = 0.02
        while True:
            pending = [i for i in self._instances if i.status != InstanceStatus.IN_SERVICE]
            if not pending and (not self._shared or self._url_answers()):
                return
            if not pending and time.monotonic() > max(i.deadline for i in self._instances):
                raise _Failed(f"the instances said they listen on port {self._instances[0].port}"
                              f", but it did not answer /ping with 200 within "
                              f"{self._startup_timeout:g} s")
            for inst in pending:
                self._check_starting(inst, first=True)
            if self._pause(delay):
                return
            delay = min(delay * 1.5, 0.25)

    def _url_answers(self) -> bool:
        """The shared address answers /ping with 200 (the instances said they listen)."""
        try:
            url = f"http://{HOST}:{self._instances[0].port}/ping"
            return bool(self._client.get(url).status_code == 200)
        except Exception:
            return False

    def _check_starting(self, inst: _Instance, *, first: bool) -> None:
        """One look at a starting instance: healthy, exited, or out of time."""
        if inst.proc is None:
            return
        code = inst.proc.poll()
        if code is None and self._healthy(inst):
            inst.status = InstanceStatus.IN_SERVICE
            inst.failed_starts = 0
            self._store.put_endpoint_instance(self._name, inst.record())
            self._say(f"instance {inst.index} in service (pid {inst.proc.pid})")
            return
        if code is None and time.monotonic() < inst.deadline:
            return
        if code is None:
            self._terminate(inst)
            what = (f"did not answer /ping with 200 within {self._startup_timeout:g} s "
                    "(container_startup_health_check_timeout)")
        else:
            what = f"exited with code {code} while loading the model"
        where = f" (port {inst.port})" if inst.port else ""
        reason = (f"instance {inst.index}{where} {what}; its output ends with:\n"
                  f"{_tail(inst.log)}")
        if first:
            raise _Failed(reason)
        inst.failed_starts += 1
        if self._fixed_port is None and not self._shared:
            inst.port = None  # perhaps its port was taken meanwhile: let it choose another
        if inst.failed_starts >= MAX_FAILED_STARTS:
            raise _Failed(f"{reason}\n(it failed to restart {inst.failed_starts} times in a row)")
        self._schedule_restart(inst)

    def _schedule_restart(self, inst: _Instance) -> None:
        backoff = min(MAX_BACKOFF_S, 0.5 * 2 ** inst.failed_starts)
        inst.restart_at = time.monotonic() + backoff
        inst.status = InstanceStatus.RESTARTING
        inst.restarts += 1
        self._store.put_endpoint_instance(self._name, inst.record())
        self._say(f"instance {inst.index} restarts in {backoff:.1f} s (restart {inst.restarts})")

    def _watch(self) -> None:
        """Keep the instances up until asked to stop; restart the ones that die."""
        next_check = 0.0
        while not self._pause(0.05):
            now = time.monotonic()
            for inst in self._instances:
                if inst.restart_at is not None:
                    if now >= inst.restart_at:
                        self._launch(inst)
                elif inst.status != InstanceStatus.IN_SERVICE:
                    self._check_starting(inst, first=False)
                elif inst.proc is not None and (code := inst.proc.poll()) is not None:
                    self._say(f"instance {inst.index} (pid {inst.proc.pid}) exited with code "
                              f"{code}; output ends with:\n{_tail(inst.log, 10)}")
                    self._schedule_restart(inst)
            if now >= next_check:  # deletion is also visible on the record (any host)
                next_check = now + 0.5
                record = self._store.find_endpoint(self._name)
                if record is None or record.status == EndpointStatus.DELETING:
                    return

    # --- stopping ---------------------------------------------------------------------

    def _terminate(self, inst: _Instance, timeout: float = 10.0) -> None:
        proc = inst.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()

    def _kill_all(self) -> None:
        for inst in self._instances:
            if inst.proc is not None and inst.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    inst.proc.terminate()
        for inst in self._instances:
            self._terminate(inst, timeout=5.0)

    def _shutdown(self, *, remove: bool) -> None:
        self._say("stopping")
        self._kill_all()
        self._upload_logs()
        if remove:
            import shutil

            # Everything deploy wrote here goes before the record does, so a client that
            # sees the record gone finds the disk freed too.
            shutil.rmtree(self._dir, ignore_errors=True)
            self._store.delete_endpoint(self._name)
        self._say("stopped")

    def _upload_logs(self) -> None:
        artifacts = self._session.artifacts
        for inst in self._instances:
            if inst.log.exists():
                with contextlib.suppress(Exception):
                    artifacts.put_file(endpoint_key(self._name, "logs", inst.log.name), inst.log)


class SupervisedEndpoints:
    """The ``EndpointBackend`` of one detached supervisor per endpoint, launched through the
    session's backend (like a job's supervisor) with the client's environment *env*."""

    def __init__(self, backend: Backend, *, env: Mapping[str, str], home: Path | str) -> None:
        self._backend = backend
        self._env = dict(env)
        self._home = Path(home)

    def owns(self, handle: Mapping[str, Any]) -> bool:
        """A supervisor's handle is the launch handle of a job backend."""
        return handle.get("backend") in BACKENDS

    def check(self, config: EndpointConfig) -> None:
        """Any config: the supervisor checks the model and its ports itself."""

    def deploy(self, name: str, *, model_data: str, config: EndpointConfig,
               code_key: str | None, requirements_key: str | None) -> Mapping[str, Any]:
        """Launch the supervisor; it reads the model, code and config from the record."""
        info = self._backend.launch(ExecContext(
            job=JobName(f"endpoint-{name}"), entrypoint=ENTRY, args=(name,), env=self._env))
        return info.to_json()

    def log(self, name: str) -> Path:
        """The supervisor's own output (the launcher writes it)."""
        return self._home / "run" / "supervisors" / f"endpoint-{name}.log"

    def refresh(self, record: EndpointRecord) -> RuntimeView:
        """Gone once the supervisor is, with the end of its log as the reason: nothing
        restarts the instances then."""
        if self._backend.is_alive(record.supervisor) is not False:
            return RuntimeView(RuntimeState.UNCHANGED)
        log = self.log(record.name)
        try:
            tail = "\n".join(log.read_text(errors="replace").rstrip().splitlines()[-20:])
        except OSError:
            tail = ""
        return RuntimeView(RuntimeState.GONE, reason=(
            f"the endpoint's supervisor ({supervisor_words(record.supervisor)}) is gone, so "
            f"nothing restarts its instances; its log ({log}) ends with:\n{tail}"))

    def delete(self, record: EndpointRecord, *, timeout: float) -> None:
        """SIGTERM the supervisor (it stops the instances and removes the record), then wait
        for it to end; SIGKILL it after *timeout*."""
        handle = record.supervisor
        if not self._backend.is_alive(handle):
            return
        self._backend.signal_stop(handle)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while time.monotonic() < deadline:
            if self._backend.is_alive(handle) is False:
                return
            time.sleep(delay)  # the supervisor stops the instances, then removes the record
            delay = min(delay * 1.5, 0.2)
        if self._backend.is_alive(handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(handle["pid"]), signal.SIGKILL)


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), as the model server counts them."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def main(name: str) -> int:
    """Entry point of an endpoint's supervisor (forked by the launcher, or spawned)."""
    from shoal._internal.proctitle import set_title
    from shoal.session import Session

    set_title("endpoint", name)
    session = Session()
    supervisor = EndpointSupervisor(session, name)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    try:
        return supervisor.run()
    finally:
        session.close()
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
