"""``shoal demo``, runtime environments: dependencies, shipped workdir, pre-execution, warm pools.

Each step is the code a user would write, run as real jobs on the embedded default.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from shoal import RemoteExecutor, remote
from shoal.cli._context import out, state
from shoal.core.ports import JobQuery

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["run_env_demo"]


def _heading(number: int, title: str) -> None:
    out().print()
    out().print(Text(f"{number}. {title}", style="bold cyan"))


def _note(text: str) -> None:
    out().print(Text(f"   {text}", style="dim"))


def run_env_demo(session: Session, first: int) -> None:
    with tempfile.TemporaryDirectory(prefix="shoal-demo-env-") as tmp, contextlib.chdir(tmp):
        _dependencies(session, first, Path(tmp))
        _workdir(session, first + 1, Path(tmp))
        _pre_execution(session, first + 2)
        _warm(session, first + 3)


def _dependencies(session: Session, number: int, tmp: Path) -> None:
    _heading(number, "dependencies='requirements.txt': an isolated uv environment, cached by lock")
    (tmp / "requirements.txt").write_text("six==1.16.0\n")

    @remote(dependencies="requirements.txt")
    def which_six() -> tuple[str, str]:
        import sys

        import six
        return six.__version__, sys.prefix

    for attempt in ("first call (builds)", "second call (cache hit)"):
        t = time.perf_counter()
        version, prefix = which_six()
        _note(f"{attempt}: six {version} from {prefix} in {time.perf_counter() - t:.2f} s")
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="which-six-", limit=1))
    lock = session.artifacts.get_bytes(f"{record.name}/env/requirements.lock").decode()
    _note(f"lock stored with the job: {' '.join(lock.split())}")
    _note(f"environments: shoal {state.home_option()}envs list")


def _workdir(session: Session, number: int, tmp: Path) -> None:
    _heading(number, "include_local_workdir=True: a local module and a data file travel along")
    (tmp / "my_features.py").write_text("def scale(rows):\n    return [2 * r for r in rows]\n")
    (tmp / "data.csv").write_text("1\n2\n3\n")
    (tmp / "scratch.tmp").write_text("left behind by the filter\n")
    sys.path.insert(0, str(tmp))
    try:
        from shoal.remote_function import CustomFileFilter

        @remote(include_local_workdir=True,
                custom_file_filter=CustomFileFilter(ignore_name_patterns=["*.tmp"]))
        def featurize() -> tuple[list[int], list[str]]:
            import os

            import my_features
            rows = [int(x) for x in open("data.csv").read().split()]
            return my_features.scale(rows), sorted(os.listdir("."))

        result, files = featurize()
    finally:
        sys.path.remove(str(tmp))
        sys.modules.pop("my_features", None)
    _note(f"result {result}; files in the job's working directory: {files}")


def _pre_execution(session: Session, number: int) -> None:
    _heading(number, "pre_execution_commands: run before the function, output in the job's log")

    @remote(pre_execution_commands=["echo preparing the job", "uname -s"])
    def ready() -> str:
        return "ready"

    _note(f"result {ready()!r}")


def _warm(session: Session, number: int) -> None:
    _heading(number, "keep_alive_period_in_seconds=60: warm workers take the next call")

    def add(a: int, b: int) -> int:
        return a + b

    with RemoteExecutor(keep_alive_period_in_seconds=60) as e:
        t = time.perf_counter()
        e.submit(add, 1, 1).result()
        cold = time.perf_counter() - t
        times = []
        for i in range(20):
            t = time.perf_counter()
            assert e.submit(add, i, 1).result() == i + 1
            times.append(time.perf_counter() - t)
    _note(f"first call {cold * 1e3:.1f} ms (starts a worker); next 20 calls p50 "
          f"{statistics.median(times) * 1e3:.1f} ms, each still its own recorded job")
