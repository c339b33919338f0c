"""The environment phase of a job: interpreter, isolated env, shipped workdir, pre-execution.

Everything here happens while the job is ``starting``; its duration is recorded on the job,
its output goes to the job's log, and a failure has its own reason (``environment``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.core.jobs import FailureKind, JobKind, JobRecord
from shoal.core.ports import ArtifactStore
from shoal.errors import ArtifactNotFound, ShoalError
from shoal.jobs.logsink import LogSink
from shoal.storage.artifacts import job_key

__all__ = ["JobPython", "PrepareError", "Preparer"]


@dataclass(frozen=True, slots=True)
class JobPython:
    """Which interpreter runs the job, how it starts, and where."""

    python: str
    fork: bool
    pythonpath: tuple[str, ...] = ()
    isolated: bool = False
    cwd: Path | None = None
    #: shoal's in-job modules for an isolated interpreter; its zygote starts with only these.
    runtime: str | None = None


class PrepareError(Exception):
    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


class Preparer:
    def __init__(self, artifacts: ArtifactStore, *, envs: Any, python: str, fork: bool,
                 payloads: Callable[[str, str], Any]) -> None:
        self._artifacts = artifacts
        self._payloads = payloads  # (job, kind) -> its Payload, wherever it is stored
        self._envs = envs
        self._python = python
        self._fork = fork

    def prepare(self, record: JobRecord, workdir: Path, sink: LogSink, *,
                inline_ok: bool = False) -> JobPython:
        """Build the job's environment; write its payloads into *workdir* unless the job runs
        on this interpreter and *inline_ok* (a warm executor takes them on its socket)."""
        spec = record.spec
        ours = f"{sys.version_info.major}.{sys.version_info.minor}"
        if spec.python_version and spec.python_version != ours:
            raise PrepareError(FailureKind.VERSION,
                               f"the client runs Python {spec.python_version} but the job would "
                               f"run Python {ours}; client and job major.minor must match")
        for notice in spec.framework_notices:
            sink.write(f"[shoal] {notice}\n".encode())
        plan = JobPython(self._python, fork=self._fork)
        conda_env = spec.conda_env
        if spec.dependencies or conda_env:
            try:
                plan = self._build_env(record, sink)
            except ShoalError as e:
                what = spec.dependencies or f"conda environment {conda_env!r}"
                raise PrepareError(FailureKind.ENVIRONMENT, f"the environment for "
                                   f"{what} could not be built: {e}") from e
        elif spec.sagemaker_alias:
            plan = self._alias_on_client_python(plan, sink)
        if spec.workdir is not None:
            plan = self._unpack_workdir(record, spec.workdir.sha256, workdir, plan, sink)
        inline = inline_ok and plan.fork and plan.runtime is None
        payloads = () if inline or spec.kind == JobKind.SCRIPT else ("function", "arguments")
        for kind in payloads:
            payload = self._payloads(record.name, kind)
            (workdir / f"{kind}.pkl").write_bytes(payload.data)
            (workdir / f"{kind}.json").write_bytes(payload.metadata)
        return plan

    def _build_env(self, record: JobRecord, sink: LogSink) -> JobPython:
        import cloudpickle

        from shoal.envs import ensure_conda_file_env, ensure_named_conda_env, ensure_runtime

        spec = record.spec
        if self._envs is None:
            raise ShoalError(f"job {record.name} asks for dependencies but this supervisor has "
                             "no environment builder")
        # The dependencies file travels under this name whatever it is called.
        text = (self._artifacts.get_bytes(job_key(record.name, "env", "requirements.txt"))
                .decode() if spec.dependencies else None)
        base_dir = Path(spec.dependencies or ".").parent
        extra = (f"cloudpickle=={cloudpickle.__version__}",)
        conda_env = spec.conda_env
        is_conda_file = bool(spec.dependencies) and str(spec.dependencies).endswith(
            (".yml", ".yaml"))

        def log(msg: str) -> None:
            sink.write(msg.encode())

        if conda_env and is_conda_file:
            raise ShoalError(f"give job_conda_env={conda_env!r} or the conda file "
                             f"{spec.dependencies}, not both; to add packages to the named "
                             "environment, give a requirements.txt")
        if conda_env:
            built = ensure_named_conda_env(str(conda_env), requirements=text, base_dir=base_dir,
                                           extra=extra, log=log)
        elif is_conda_file and text is not None:
            built = ensure_conda_file_env(text, source=str(spec.dependencies),
                                          uv_builder=self._envs, base_dir=base_dir, extra=extra,
                                          client_python=self._python, log=log,
                                          strict=spec.strict_versions)
        else:
            built = self._envs.ensure(text or "", base_dir=base_dir, extra=extra, log=log)
        self._artifacts.put_bytes(job_key(record.name, "env", "requirements.lock"),
                                  built.lock.encode())
        how = "cached" if built.cached else "built"
        sink.write(f"[shoal] environment {built.key[:16]} ({how}) in {built.seconds:.2f} s\n"
                   .encode())
        runtime = ensure_runtime(self._envs.root.parent / "runtime")
        pythonpath: tuple[str, ...] = (str(runtime),)
        if spec.sagemaker_alias:
            pythonpath = (*self._framework_job_path(built.path, sink), *pythonpath)
        return JobPython(str(built.python), fork=False, pythonpath=pythonpath,
                         isolated=True, runtime=str(runtime))

    def _framework_job_path(self, env: Path, sink: LogSink) -> tuple[str, ...]:
        """What a framework job's environment adds, as SageMaker's containers have it: shoal's
        whole package on the path, and ``sagemaker`` importing it (``envs._sagemaker_alias``)."""
        from shoal.envs import ensure_package_path, write_sagemaker_alias_pth

        for site in sorted(env.glob("lib/python*/site-packages")):
            if not write_sagemaker_alias_pth(site):
                sink.write(b"[shoal] a sagemaker package is installed in the job's environment; "
                           b"the job imports it rather than shoal\n")
        return (str(ensure_package_path(self._envs.root.parent / "package")),)

    def _alias_on_client_python(self, plan: JobPython, sink: LogSink) -> JobPython:
        """A framework job on the client's interpreter: ``sagemaker`` on its path, as shoal."""
        import importlib.util

        from shoal.envs import sagemaker_alias_dir

        if importlib.util.find_spec("sagemaker") is not None:
            sink.write(b"[shoal] a sagemaker package is installed; the job imports it rather "
                       b"than shoal\n")
            return plan
        if self._envs is None:
            return plan
        alias = sagemaker_alias_dir(self._envs.root.parent / "runtime" / "sagemaker-alias")
        return JobPython(plan.python, plan.fork, (str(alias), *plan.pythonpath), plan.isolated,
                         plan.cwd, plan.runtime)

    def _unpack_workdir(self, record: JobRecord, sha: str, workdir: Path, plan: JobPython,
                        sink: LogSink) -> JobPython:
        from shoal.envs.workdir import unpack_workdir

        try:
            data = self._artifacts.get_bytes(job_key(record.name, "workdir", f"{sha}.zip"))
        except ArtifactNotFound as e:
            raise PrepareError(FailureKind.INTERNAL, f"the shipped workdir is missing: {e}") from e
        target = workdir / "src"
        try:
            unpack_workdir(data, target)
        except ShoalError as e:
            raise PrepareError(FailureKind.ENVIRONMENT, str(e)) from e
        sink.write(f"[shoal] workdir {sha[:12]} unpacked ({len(data)} bytes)\n".encode())
        return JobPython(plan.python, plan.fork, (str(target), *plan.pythonpath), plan.isolated,
                         cwd=target, runtime=plan.runtime)

    # --- pre-execution --------------------------------------------------------------------

    def pre_execute(self, record: JobRecord, plan: JobPython, env: dict[str, str],
                    workdir: Path, sink: LogSink, should_stop: Callable[[], bool]) -> None:
        """Run the job's pre-execution commands or script, in its environment, in order."""
        spec = record.spec
        commands = list(spec.pre_execution_commands)
        if spec.pre_execution_script:
            script = workdir / "pre_exec.sh"
            script.write_bytes(self._artifacts.get_bytes(
                job_key(record.name, "env", "pre_exec.sh")))
            commands.append(f"bash {shlex.quote(str(script))}")
        if not commands:
            return
        env = dict(env)
        if plan.isolated:  # the environment's own tools first, as an activated venv would
            env_bin = str(Path(plan.python).parent)
            env["PATH"] = os.pathsep.join([env_bin, env.get("PATH", "")])
            env["VIRTUAL_ENV"] = str(Path(env_bin).parent)
        env.pop("SHOAL_JOB_KEY", None)
        shell = shutil.which("bash") or "/bin/sh"
        for command in commands:
            sink.write(f"[shoal] pre-execution: $ {command}\n".encode())
            t0 = time.monotonic()
            code, tail = _run_streaming([shell, "-c", command], env=env,
                                        cwd=plan.cwd or workdir, sink=sink,
                                        should_stop=should_stop)
            if code != 0:
                raise PrepareError(
                    FailureKind.ENVIRONMENT,
                    f"pre-execution command {command!r} exited with code {code} after "
                    f"{time.monotonic() - t0:.1f} s; its output ends with:\n{tail}")


def _run_streaming(argv: list[str], *, env: dict[str, str], cwd: Path, sink: LogSink,
                   should_stop: Callable[[], bool]) -> tuple[int, str]:
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    lines: list[str] = []
    if proc.stdout is None:  # Popen(stdout=PIPE) always sets it
        raise RuntimeError("no output pipe")
    for raw in iter(proc.stdout.readline, b""):
        sink.write(raw)
        lines = [*lines[-19:], raw.decode(errors="replace").rstrip()]
        if should_stop():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the shell and what it started
            break
    proc.stdout.close()
    return proc.wait(), "\n".join(lines)
