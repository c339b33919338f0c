"""The wake-up a job's end sends to the clients waiting for it on this host (jobs/_wake.py):
real Unix sockets, a real second process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shoal.jobs._wake import notify, open_channel


def test_a_notify_from_another_process_wakes_only_that_jobs_waiter(tmp_path: Path) -> None:
    wake = tmp_path / "wake"
    mine, other = open_channel(wake, "job-a"), open_channel(wake, "job-b")
    assert mine is not None and other is not None
    code = f"from pathlib import Path; from shoal.jobs._wake import notify; " \
           f"notify(Path({str(wake)!r}), ['job-a'])"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert mine.wait(30.0) is True
    assert other.wait(0.0) is False  # another job's end wakes no one else
    mine.close()
    other.close()
    assert list(wake.iterdir()) == []  # a closed channel leaves nothing behind


def test_a_dead_waiters_socket_is_removed_and_a_missing_directory_is_no_error(
        tmp_path: Path) -> None:
    wake = tmp_path / "wake"
    notify(wake, ["job-a"])  # nobody ever waited here: nothing to do, no error
    channel = open_channel(wake, "job-a")
    assert channel is not None
    channel._sock.close()  # its client died without closing: the file stays, nobody reads
    assert channel.path.exists()
    notify(wake, ["job-a"])
    assert not channel.path.exists()


@pytest.mark.skipif(sys.platform.startswith("linux"), reason="Linux binds abstract addresses")
def test_a_home_too_long_for_a_socket_address_gets_no_channel(tmp_path: Path) -> None:
    assert open_channel(tmp_path / ("x" * 120), "job-a") is None  # the caller polls instead


def test_a_long_home_still_gets_a_channel_on_linux(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("abstract socket addresses are Linux's")
    wake = tmp_path / ("x" * 120) / "wake"
    channel = open_channel(wake, "job-a")
    assert channel is not None
    notify(wake, ["job-a"])
    assert channel.wait(30.0) is True
    channel.close()
