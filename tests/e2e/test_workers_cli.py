"""``shoal workers list|stop`` and process titles (issue #17 item 5): a real launcher and a
real warm worker of a home, found, titled, measured and stopped."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal
from helpers import wait_until
from shoal import remote
from shoal.backends.workers import _pool_dirs

CLI = [sys.executable, "-m", "shoal.cli"]
HAS_SETPROCTITLE = importlib.util.find_spec("setproctitle") is not None


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ), stdin=subprocess.DEVNULL)


@pytest.fixture
def session(clean_env: Path) -> Iterator[shoal.Session]:
    s = shoal.Session(home=str(clean_env), launcher_idle_seconds=120)  # SHOAL_HOME of the CLI
    yield s
    run_cli("workers", "stop", "--all", "--grace", "5")
    s.backend.shutdown_launcher()
    s.close()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_list_titles_and_stop_a_launcher_and_a_warm_worker(session) -> None:
    @remote(sagemaker_session=session, keep_alive_period_in_seconds=120)
    def where() -> int:
        return os.getpid()

    where()
    workers = wait_until(
        lambda: (w := json.loads(run_cli("workers", "list", "--json").stdout))
        and {x["kind"] for x in w} >= {"launcher", "warm-worker"} and w, 60,
        what="a launcher and an idle warm worker to be listed")
    by_kind = {w["kind"]: w for w in workers}
    launcher, warm = by_kind["launcher"], by_kind["warm-worker"]
    for w in (launcher, warm):
        assert w["home"] == str(session.home) and w["rss_bytes"] > 1 << 20
        assert w["idle_seconds"] is not None and w["idle_seconds"] >= 0
    assert warm["state"] == "idle"

    # Titles: the kernel's name always; the whole command line with setproctitle.
    assert _comm(launcher["pid"]) == "shoal-launcher"
    assert _comm(warm["pid"]) == "shoal-warm-work"
    if HAS_SETPROCTITLE:
        # (The home when its socket is in HOME/run; here its path is too long for AF_UNIX,
        # so the socket is in the private socket directory and the title names the socket.)
        cmdline = Path(f"/proc/{launcher['pid']}/cmdline").read_bytes()
        assert cmdline.startswith(b"shoal launcher /"), cmdline
        worker_cmdline = Path(f"/proc/{warm['pid']}/cmdline").read_bytes()
        assert worker_cmdline.startswith(f"shoal warm-worker {warm['name']} idle".encode())

    table = run_cli("workers", "list")
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[0].split()
    assert header == ["PID", "KIND", "NAME", "STATE", "IDLE", "MEMORY", "HOME"]
    assert str(warm["pid"]) in table.stdout and "MiB" in table.stdout

    # The pool lives under the home, or in the private socket directory when that path is
    # too long for AF_UNIX (as with pytest's tmp_path), marked with the home's run directory.
    [claim] = [c for d in _pool_dirs(session.home / "run") for c in d.glob(f"{warm['pid']}.claim")]
    stopped = run_cli("workers", "stop", str(warm["pid"]), "--grace", "20")
    assert stopped.returncode == 0, stopped.stderr
    assert f"warm-worker {warm['name']} (pid {warm['pid']})" in stopped.stdout
    assert not _alive(warm["pid"]) and not claim.exists()
    assert not claim.with_suffix(".sock").exists()

    unknown = run_cli("workers", "stop", "1")
    assert unknown.returncode == 3 and "not a shoal worker" in unknown.stderr
    usage = run_cli("workers", "stop")
    assert usage.returncode == 2

    everything = run_cli("workers", "stop", "--all", "--grace", "20")
    assert everything.returncode == 0, everything.stderr
    assert "launcher" in everything.stdout and not _alive(launcher["pid"])
    assert not Path(session.backend.launcher_socket_path()).exists()  # its socket
    nothing = run_cli("workers", "list")
    assert nothing.returncode == 0 and "nothing runs in the background" in nothing.stderr


def test_a_job_supervisor_is_titled_with_the_job(session, tmp_path) -> None:
    @remote(sagemaker_session=session)
    def my_comm() -> str:
        return Path(f"/proc/{os.getppid()}/comm").read_text().strip()

    # The job's process is the supervisor's child (fork mode): its parent is the supervisor.
    assert my_comm() == "shoal-superviso"
