"""Helpers shared by the test suites (import as ``from helpers import ...``)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["DDP_SCRIPT", "FakeClock", "Followed", "cli_test_session", "endpoint_test_session", "flip_stored_byte",
           "fresh_postgres_database", "memory_job_service", "rank_lines", "wait_until"]

#: A torch-distributed training script (gloo on CPU): each rank all-reduces rank + 1 and prints
#: what it saw as one JSON line; rank 0 writes the world size into the model directory.
DDP_SCRIPT = """
import json, os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(json.dumps({"rank": rank, "world": world, "sum": t.item(),
                  "local_rank": os.environ["LOCAL_RANK"], "host": os.environ["SM_CURRENT_HOST"],
                  "hosts": json.loads(os.environ["SM_HOSTS"]),
                  "node": os.environ.get("SHOAL_RAY_NODE_ID", "this machine"),
                  "master": os.environ["MASTER_ADDR"] + ":" + os.environ["MASTER_PORT"]}),
      flush=True)
if rank == 0:
    open(os.path.join(os.environ["SM_MODEL_DIR"], "world.txt"), "w").write(str(world))
dist.barrier()
dist.destroy_process_group()
"""


def rank_lines(log: str) -> dict[str, dict]:
    """``{"[algo-1 rank 0]": what that rank printed}`` from a DDP_SCRIPT job's log."""
    import json

    return {line.partition("] ")[0] + "]": json.loads(line.partition("] ")[2])
            for line in log.splitlines() if line.startswith("[algo-") and "{" in line}


def wait_until(predicate: Callable[[], T], timeout: float, *, interval: float = 0.01,
               what: str | None = None) -> T:
    """Poll *predicate* until it returns something truthy; return that value.

    Exceptions raised by *predicate* count as "not yet". After *timeout* seconds raise
    ``TimeoutError`` naming *what* and chaining the last exception (or showing the last value).
    This loop is the only place the tests sleep.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    last_value: object = None
    delay = interval
    while True:
        try:
            value = predicate()
        except Exception as e:  # reported below if it never succeeds
            last_exc = e
        else:
            if value:
                return value
            last_exc, last_value = None, value
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__name__", repr(predicate))
            if last_exc is not None:
                raise TimeoutError(f"{name} did not hold within {timeout}s; last error: "
                                   f"{type(last_exc).__name__}: {last_exc}") from last_exc
            raise TimeoutError(f"{name} did not hold within {timeout}s; last value: "
                               f"{last_value!r}")
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.2)


@contextmanager
def fresh_postgres_database(server_url: str) -> Iterator[str]:
    """Create an empty, uniquely named database on *server_url*'s server; drop it afterwards.

    Each xdist worker gets its own database, so one worker's clean-up never removes another
    worker's rows.
    """
    import sqlalchemy as sa

    base = sa.engine.make_url(server_url)
    if base.drivername == "postgresql":
        base = base.set(drivername="postgresql+psycopg")
    name = f"shoal_t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT",
                             poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


class FakeClock:
    """A clock that moves only when told to (thread-safe); stores take it as ``clock=``."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 1.0) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


class Moment(datetime):
    """A moment of a real clock that another party (a server) stamps records with: it
    compares equal to any aware time from itself until the comparison, so a test written
    for ``FakeClock``'s exact times checks through a server that each time falls between
    the moment the test took and now."""

    __hash__ = datetime.__hash__

    @classmethod
    def take(cls) -> Moment:
        from datetime import UTC

        now = datetime.now(UTC)
        return cls(now.year, now.month, now.day, now.hour, now.minute, now.second,
                   now.microsecond, tzinfo=now.tzinfo)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, datetime) or other.tzinfo is None:
            return NotImplemented
        from datetime import UTC

        return datetime.__le__(self, other) and other <= datetime.now(UTC)

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq


class ServerClock:
    """``FakeClock``'s face for a store behind a server, whose clock cannot be set:
    ``advance`` waits until the real clock has moved on (so two writes are ordered) and
    returns a ``Moment``; ``start`` is the moment the test began."""

    def __init__(self) -> None:
        self.start = Moment.take()

    def now(self) -> Moment:
        return Moment.take()

    def advance(self, seconds: float = 1.0) -> Moment:
        before = time.time()
        wait_until(lambda: time.time() > before + 0.002, 5, interval=0.001,
                   what="the clock to move")
        return Moment.take()


class Followed:
    """A command whose output is read line by line as it comes (``shoal jobs logs -f``):
    ``lines`` grows while it runs; ``wait`` returns its exit code once every line is in.
    Use as a context manager: a command still running at the end is killed."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        import subprocess

        self.lines: list[str] = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, stdin=subprocess.DEVNULL, env=env)
        out = self.proc.stdout
        assert out is not None
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(out.readline, "")),
                                        daemon=True)
        self._reader.start()

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def __enter__(self) -> Followed:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def endpoint_test_session(session: Any, *, local: bool) -> Iterator[Any]:
    """*session* in use for an endpoint test; afterwards every endpoint it left is deleted,
    and (*local*) its launcher stopped, before it closes."""
    import shoal
    from shoal.endpoints import EndpointService

    service = EndpointService.for_session(session)
    with shoal.use(session):
        yield session
    try:
        for record in session.metadata.list_endpoints():
            service.delete(record.name)
    finally:
        if local:
            session.backend.shutdown_launcher()
        session.close()


@contextmanager
def cli_test_session(home: Any) -> Iterator[Any]:
    """A session on the CLI's home for a test: on the way out its unfinished jobs are stopped
    and waited for (bounded), its launcher shut down and the session closed."""
    import shoal

    s = shoal.Session(home=str(home), launcher_idle_seconds=60)
    try:
        yield s
    finally:
        try:
            for record in s.metadata.iter_unfinished():
                s.jobs.cancel(record.name)
                s.jobs.wait(record.name, timeout=30)
        finally:
            s.backend.shutdown_launcher()
            s.close()


@contextmanager
def small_tmpfs(where: Any, *, size: str = "1m") -> Iterator[Any]:
    """A real, tiny file system mounted at *where* (a Path), to produce a full disk (ENOSPC)
    or, with ``remount_read_only``, a read-only one (root writes through chmod, not through
    a read-only mount). Skips the test where mounting is not allowed (not root, no
    CAP_SYS_ADMIN)."""
    import os
    import subprocess

    import pytest

    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                              str(where)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or os.strerror(1)}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount_read_only(where: Any) -> None:
    """Make a ``small_tmpfs`` read-only in place (what a read-only volume looks like)."""
    import subprocess

    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def linear_onnx(path: Any, weights: Any, bias: Any) -> None:
    """Write ``y = x @ weights + bias`` as an ONNX graph with a dynamic batch axis (4 -> 2)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


def flip_stored_byte(session: Any, job: str, kind: str) -> str:
    """Change one byte of job *job*'s stored *kind* pickle where it is stored (a row of the
    metadata store for a small payload, ``<job>/<kind>/payload.pkl`` for a large one), as
    someone who can write there would; its metadata (and HMAC) stay. Returns where."""
    from shoal.storage.artifacts import job_key

    row = session.metadata.get_job_payload(job, kind)
    if row is not None:
        data = bytearray(row[0])
        data[-2] ^= 0xFF
        session.metadata.put_job_payloads(job, {kind: (bytes(data), row[1])})
        return "database"
    key = job_key(job, kind, "payload.pkl")
    data = bytearray(session.artifacts.get_bytes(key))
    data[-2] ^= 0xFF
    session.artifacts.put_bytes(key, bytes(data))
    return "file"


def old_shape_spec(name: str) -> dict[str, Any]:
    """A script job's spec JSON as the code before JobSpec's typed parts stored it (all of
    them under ``extra``), with every key that code wrote (issue #18, item 3)."""
    return {
        "name": name, "kind": "script", "function_name": "train.py",
        "instance_type": "ml.m5.xlarge", "cpus": 4.0, "memory_mib": 16384, "gpus": 1,
        "allow_cpu_fallback": True, "environment_variables": {"A": "1"}, "dependencies": None,
        "pre_execution_commands": [], "pre_execution_script": None, "max_runtime_in_seconds": 600,
        "max_retry_attempts": 3, "stop_grace_period_in_seconds": 2.5,
        "keep_alive_period_in_seconds": 30, "tags": [["team", "ml"]], "python_version": "3.11",
        "inert_settings": {},
        "extra": {
            "training": {
                "entry_point": "train.py", "source_key": "j/source/sourcedir.tar.gz",
                "source_uri": "file:///a/j/source/sourcedir.tar.gz",
                "hyperparameters": {"epochs": 2},
                "channels": {"train": {"uri": "file:///data", "input_mode": "File"}},
                "output_path": None, "output_root": "file:///a",
                "metric_definitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
                "checkpoint_uri": "file:///ck", "checkpoint_s3_uri": "file:///ck",
                "checkpoint_local_path": "/opt/ml/checkpoints", "instance_count": 2,
                "volume_size": 30, "input_mode": "File",
                "distribution_config": {"torch_distributed": {"enabled": True}},
                "framework": ["torch", "torch==2.3.*"], "framework_module": "",
                "estimator": "PyTorch"},
            "distribution": {"hosts": 2, "per_host": 1, "torchrun": True},
            "sagemaker_alias": True, "strict_versions": True, "framework_notices": ["n1"],
            "run": {"experiment_name": "exp", "run_name": "r1"},
            "gpu_fallback": "ran on CPU: no GPU", "sys_path": ["/src"], "conda_env": "base",
            "checkpoint_s3_uri": "file:///fn-ck", "workdir_sha256": "cd" * 32,
            "workdir_files": 4, "workdir_bytes": 99, "batch": {"id": "b7", "index": 2},
            "client": {"host": "host-a", "pid": 42, "start_ticks": 1234},
        },
    }


def memory_job_service(root: Any, *, backend: Any = None, clock: Any = None,
                       keys: bool = True) -> Any:
    """A ``JobService`` on a real SQLite store and local artifact store under *root*, with a
    ``MemoryBackend`` (``shoal.backends.memory``) for the test to play the supervisor; the
    store and backend are ``service.metadata`` and ``service.backend``. *keys*: the client's
    side (derives job keys from a user secret under *root*), else a supervisor's (none)."""
    from pathlib import Path

    from shoal.backends.memory import MemoryBackend
    from shoal.jobs.keys import UserKeys
    from shoal.jobs.service import JobService
    from shoal.storage.artifacts import FsspecArtifactStore
    from shoal.storage.sql import SqlMetadataStore

    root = Path(root)
    store = SqlMetadataStore.open(f"sqlite:///{root / 'metadata.db'}", create=True)
    return JobService(store, FsspecArtifactStore.open(str(root / "artifacts")),
                      backend if backend is not None else MemoryBackend(), metrics=store,
                      supervisor_entrypoint="shoal.session:supervisor_main",
                      supervisor_env={"SHOAL_HOME": str(root)}, clock=clock,
                      keys=UserKeys(root / "user.secret") if keys else None)
