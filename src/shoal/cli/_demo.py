"""``shoal demo``: the seed examples, run as real jobs on the embedded default.

Every step is the code a user would write; after each one the demo looks the job up in the
metadata store and prints its name, status and result, and the command that finds it again.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.text import Text

import shoal
from shoal import RemoteExecutor, remote
from shoal.cli._context import out, state
from shoal.cli._render import elapsed_seconds, format_duration, mask_env, status_text
from shoal.core.jobs import JobRecord
from shoal.core.ports import JobQuery
from shoal.errors import JobFailedError
from shoal.remote_function import get_future
from shoal.session import current, use

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["run_demo"]

_CONFIG_YAML = """\
SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      RemoteFunction:
        InstanceType: ml.m5.large
        Dependencies: ./requirements.txt
        EnvironmentVariables: {"EnvVarKey": "EnvVarValue"}
        Tags:
          - {"Key": "someTagKey", "Value": "someTagValue"}
"""


def _heading(number: int, title: str) -> None:
    out().print()
    out().print(Text(f"{number}. {title}", style="bold cyan"))


def _show(record: JobRecord, result: Any = None, *, show_result: bool = True) -> None:
    line = Text("   job ") + Text(record.name, style="bold") + Text("  ")
    line += status_text(record.status)
    line += Text(f"  {format_duration(elapsed_seconds(record))}", style="dim")
    if show_result:
        line += Text(f"  result {result!r}")
    out().print(line)
    out().print(Text(f"   find it again: shoal {state.home_option()}jobs describe {record.name}",
                     style="dim"))


@contextlib.contextmanager
def _new_job(session: Session, prefix: str) -> Iterator[Callable[[], JobRecord]]:
    """Yield a getter for the newest job named *prefix*-... created inside the block."""
    since = datetime.now(UTC)

    def newest() -> JobRecord:
        [record] = session.metadata.list_jobs(JobQuery(name_prefix=f"{prefix}-",
                                                       created_after=since, limit=1))
        found: JobRecord = session.jobs.get(record.name)
        return found

    yield newest


def run_demo() -> None:
    started = time.monotonic()
    since = datetime.now(UTC)
    with contextlib.ExitStack() as stack:
        if state.home is not None:
            stack.enter_context(use(state.session()))
        session = current()
        out().print(Text("shoal demo: the SageMaker @remote examples as real local jobs",
                         style="bold"))
        out().print(Text(f"home {session.home}  (records: "
                         f"{session.settings.resolved_metadata_url()})", style="dim"))
        divide, divide_job = _divide(session)
        _matrix_multiply(session)
        _executor()
        _failure(session, divide)
        _config_file(session)
        _get_future(divide_job)
        from shoal.cli._demo_envs import run_env_demo

        run_env_demo(session, 7)
        from shoal.cli._demo_training import run_training_demo

        run_training_demo(session, 11)
        from shoal.cli._demo_endpoints import run_endpoint_demo

        run_endpoint_demo(session, 12, since)
        from shoal.cli._demo_bundles import run_bundle_demo

        run_bundle_demo(session, 13, since)
        from shoal.cli._demo_llm import run_llm_demo

        run_llm_demo(session, 14)
        from shoal.cli._demo_sagemaker import run_sagemaker_demo

        run_sagemaker_demo(16)
        from shoal.cli._demo_security import run_cli_demo, run_security_demo

        run_security_demo(session, 17)
        run_cli_demo(session, 18)
        from shoal.cli._demo_server import run_server_demo

        run_server_demo(19)
    out().print()
    out().print(Text(f"done in {time.monotonic() - started:.1f}s. All jobs: "
                     f"shoal {state.home_option()}jobs list", style="bold green"))
    out().print(Text(f"In the browser: shoal {state.home_option()}ui, then open "
                     "http://127.0.0.1:8766/ (jobs, logs, experiments, charts)",
                     style="bold green"))


def _divide(session: Session) -> tuple[Callable[..., Any], str]:
    _heading(1, "@remote(instance_type='ml.m5.xlarge') def divide(x, y)")
    with _new_job(session, "divide") as job:
        @remote(instance_type="ml.m5.xlarge")
        def divide(x: float, y: float) -> float:
            return x / y
        print(divide(2, 3.0))
    record = job()
    _show(record, session.jobs.outcome(record))
    return divide, record.name


def _matrix_multiply(session: Session) -> None:
    _heading(2, "@remote(instance_type='ml.m5.large') with numpy")
    with _new_job(session, "matrix-multiply") as job:
        @remote(instance_type="ml.m5.large")
        def matrix_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.asarray(np.matmul(a, b))
        assert (matrix_multiply(np.array([[1, 0], [0, 1]]), np.array([1, 2])) == np.array([1, 2])).all()  # noqa: E501
    record = job()
    _show(record, session.jobs.outcome(record).tolist())


def _executor() -> None:
    _heading(3, "RemoteExecutor(instance_type='ml.m5.large', max_parallel_jobs=2)")

    def square(x: int) -> int:
        return x * x
    with RemoteExecutor(instance_type="ml.m5.large", max_parallel_jobs=2) as e:
        futures = [e.submit(square, i) for i in range(4)]
    assert [f.result() for f in futures] == [0, 1, 4, 9]
    out().print(Text(f"   results {[f.result() for f in futures]!r}"))
    service = current().jobs
    for future in futures:
        assert future.job_name is not None  # named once submitted
        _show(service.get(future.job_name), future.result())


def _failure(session: Session, divide: Callable[..., Any]) -> None:
    _heading(4, "a failing call: divide(1, 0)")
    with _new_job(session, "divide") as job:
        try:
            divide(1, 0)
        except ZeroDivisionError as e:
            error: ZeroDivisionError | None = e
        else:
            error = None
    if error is None:
        raise JobFailedError("divide(1, 0) returned instead of raising ZeroDivisionError")
    record = job()
    cause = error.__cause__
    job_name = cause.details.get("job") if isinstance(cause, JobFailedError) else record.name
    has_traceback = any("Remote traceback" in note for note in getattr(error, "__notes__", ()))
    out().print(Text(f"   raised ZeroDivisionError: {error}: the function's own exception, "
                     f"re-raised here with the remote traceback "
                     f"{'attached as a note' if has_traceback else 'in the log above'}; "
                     f"its __cause__ is a JobFailedError naming job {job_name}"))
    _show(record, show_result=False)
    out().print(Text(f"   failure: {record.failure_kind}: {record.failure_reason}", style="red"))


def _config_file(session: Session) -> None:
    _heading(5, "a SageMaker config file: @remote with no arguments")
    with tempfile.TemporaryDirectory(prefix="shoal-demo-") as tmp, contextlib.chdir(tmp):
        # Dependencies: ./requirements.txt is relative to the working directory, as on SageMaker.
        Path("config.yaml").write_text(_CONFIG_YAML, encoding="utf-8")
        Path("requirements.txt").write_text("numpy\n", encoding="utf-8")
        config_path = Path(tmp) / "config.yaml"
        out().print(Text(f"   wrote {config_path} and requirements.txt (numpy)", style="dim"))
        config_session = shoal.Session(config_files=[config_path], **state.session_kwargs())
        try:
            with _new_job(config_session, "numpy-version") as job:
                @remote(sagemaker_session=config_session)
                def numpy_version() -> str:
                    return np.__version__
                result = numpy_version()
            record = job()
            for key, item in sorted(config_session.defaults.remote_function.items()):
                value = mask_env(item.value) if key == "EnvironmentVariables" else item.value
                out().print(Text(f"   {key} = {value!r}  from {item.source}", style="dim"))
        finally:
            config_session.close()
    spec = record.spec
    out().print(Text(f"   the job ran with instance_type={spec.instance_type}, "
                     f"dependencies={spec.dependencies}, environment variables "
                     f"{mask_env(spec.environment_variables)} (values of secret-looking "
                     f"names are masked), tags {dict(spec.tags)}"))
    _show(record, result)


def _get_future(job_name: str) -> None:
    _heading(6, "get_future(job_name): a future rebuilt from the job's record")
    future = get_future(job_name)
    result = future.result()
    out().print(Text(f"   get_future({job_name!r}).result() -> {result!r}"))
    _show(current().jobs.get(job_name), result)
