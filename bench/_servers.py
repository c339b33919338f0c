"""Starting, timing and measuring HTTP servers for bench/server.py: ``shoal server`` and its
anchor, MLflow's ``mlflow server``, in a virtual environment of its own.

MLflow is never installed into shoal's environment: ``mlflow_python()`` makes
``<bench scratch>/mlflow-venv`` with ``uv venv`` + ``uv pip install --compile-bytecode
'mlflow==3.*'`` once (uv's cache makes a rebuild fast) and reuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from _common import scratch

__all__ = ["MLFLOW_SPEC", "Server", "free_port", "median_ms", "mlflow_log", "mlflow_python",
           "mlflow_version", "pct", "shoal_env", "shoal_token", "start_mlflow", "start_shoal",
           "tree_memory", "wait_answer"]

MLFLOW_SPEC = "mlflow==3.*"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A server process (its own process group), its URL and the seconds until it answered."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    startup_s: float
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def wait_answer(proc: subprocess.Popen[bytes], url: str, log: Path, t0: float,
                 timeout: float = 180.0) -> float:
    """Seconds from *t0* until GET *url* answers 200 (polled every 5 ms)."""
    deadline = t0 + timeout
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}: "
                               f"{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.005)  # a bounded poll on a process this bench started
    raise TimeoutError(f"{url} did not answer within {timeout:g} s; log: {log}")


def _spawn(name: str, argv: list[str], *, env: dict[str, str], cwd: Path, log: Path,
           probe: str, port: int) -> Server:
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        seconds = wait_answer(proc, url + probe, log, t0)
    except BaseException:
        Server(name, proc, url, 0.0, log).stop()
        raise
    return Server(name, proc, url, seconds, log)


def shoal_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    return {**env, "SHOAL_HOME": str(home)}


def shoal_token(home: Path) -> str:
    """``shoal server init`` on *home*: the first admin's token."""
    done = subprocess.run([sys.executable, "-m", "shoal.cli", "server", "init"],
                          env=shoal_env(home), capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"shoal server init failed: {done.stderr[-2000:]}")
    return done.stdout.strip()


def start_shoal(home: Path, *, extra: tuple[str, ...] = ()) -> Server:
    """``shoal server`` on *home* (tokens on), timed until ``GET /api/v1/version`` answers."""
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "shoal.cli", "server", "--port", str(port), *extra]
    return _spawn("shoal", argv, env=shoal_env(home), cwd=home, log=home / f"server-{port}.log",
                  probe="/api/v1/version", port=port)


def mlflow_python() -> Path:
    """The Python of MLflow's own venv under the bench scratch directory (made once)."""
    venv = Path(scratch()) / "mlflow-venv"
    python = venv / "bin" / "python"
    marker = venv / ".shoal-bench-installed"
    if marker.exists() and marker.read_text() == MLFLOW_SPEC and python.exists():
        return python
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    shutil.rmtree(venv, ignore_errors=True)
    print(f"making MLflow's venv: {venv} ({MLFLOW_SPEC}; uv {uv})", file=sys.stderr)
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), "--compile-bytecode",
                    MLFLOW_SPEC], check=True)
    marker.write_text(MLFLOW_SPEC)
    return python


def mlflow_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import mlflow; print(mlflow.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def start_mlflow(python: Path, workdir: Path) -> Server:
    """``mlflow server`` with its defaults (workers, artifact proxy) on SQLite in *workdir*,
    timed until ``GET /health`` answers."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [str(python.parent / "mlflow"), "server", "--backend-store-uri",
            f"sqlite:///{workdir / 'mlflow.db'}", "--host", "127.0.0.1", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHONPATH"))}
    return _spawn("mlflow", argv, env=env, cwd=workdir, log=workdir / f"mlflow-{port}.log",
                  probe="/health", port=port)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree_memory(pid: int) -> tuple[int, int, int]:
    """(RSS bytes, PSS bytes, processes) of *pid* and all its descendants, from
    ``/proc/<pid>/smaps_rollup`` (RSS counts shared pages once per process; PSS splits them)."""
    kids = _children()
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += kids.get(p, [])
    rss = pss = 0
    for p in seen:
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
            elif line.startswith("Pss:"):
                pss += int(line.split()[1]) * 1024
    return rss, pss, len(seen)


#: The MLflow side of the metrics bench, run with MLflow's own Python: argv url, points,
#: batch size, single-call points; prints one JSON line.
MLFLOW_CLIENT = """
import json, sys, time
from mlflow import MlflowClient
from mlflow.entities import Metric
url, points, batch, single = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
client = MlflowClient(tracking_uri=url)
exp = client.create_experiment(f"bench-{time.time_ns()}")
run = client.create_run(exp).info.run_id
now = int(time.time() * 1000)
metrics = [Metric("loss", 1.0 / (i + 1), now + i, i) for i in range(points)]
client.log_batch(run, metrics=[Metric("warm-up", 0.0, now, 0)])
t = time.perf_counter()
for i in range(0, points, batch):
    client.log_batch(run, metrics=metrics[i:i + batch])
batch_s = time.perf_counter() - t
stored = len(client.get_metric_history(run, "loss"))
assert stored == points, (stored, points)
run2 = client.create_run(exp).info.run_id
client.log_metric(run2, "warm-up", 0.0)
t = time.perf_counter()
for i in range(single):
    client.log_metric(run2, "loss", 1.0 / (i + 1), step=i)
single_s = time.perf_counter() - t
print(json.dumps({"batch_s": batch_s, "single_s": single_s, "single": single}))
"""


def mlflow_log(python: Path, url: str, points: int, batch: int, single: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHONPATH"))}
    done = subprocess.run([str(python), "-c", MLFLOW_CLIENT, url, str(points), str(batch),
                           str(single)], env=env, capture_output=True, text=True, timeout=1800,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the MLflow client failed: {done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
