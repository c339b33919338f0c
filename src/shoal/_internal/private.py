"""Keeping SHOAL_HOME to its user: the home is 0700, the files shoal writes in it 0600.

The home holds every job's key, secrets, payloads and logs, so another Unix user must not
read it, whatever the umask. shoal's own long-lived processes (the launcher and the
supervisors it forks) run with umask 077; the client writes its few files (the SQLite
database, artifacts) with explicit modes; a job's own process gets the client's umask back
(``SHOAL_CLIENT_UMASK``), so files a job writes elsewhere are as the user expects.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CLIENT_UMASK_VAR", "client_umask", "create_private_file", "private_home",
           "restore_client_umask"]

logger = logging.getLogger("shoal.home")

#: Carries the client's umask to the job's own process.
CLIENT_UMASK_VAR = "SHOAL_CLIENT_UMASK"
_warned: set[str] = set()
_lock = threading.Lock()


def private_home(path: str | os.PathLike[str]) -> Path:
    """Create *path* (mode 0700) if missing; warn once per process, naming it, when it
    exists and others may enter or read it."""
    home = Path(path)
    try:
        home.mkdir(mode=0o700, parents=True)
        os.chmod(home, 0o700)  # mkdir's mode passes through the umask; this does not
        return home
    except FileExistsError:
        pass
    try:
        mode = stat.S_IMODE(os.stat(home).st_mode)
    except OSError:
        return home
    if mode & 0o077:
        key = str(home.resolve())
        with _lock:
            if key in _warned:
                return home
            _warned.add(key)
        logger.warning("SHOAL_HOME %s is mode %03o: other users of this machine can read job "
                       "keys, secrets, payloads and logs in it. Run: chmod 700 %s",
                       home, mode, home)
    return home


def create_private_file(path: str | os.PathLike[str]) -> None:
    """Create *path* empty with mode 0600 unless it exists (e.g. a SQLite database, whose
    -wal and -shm files SQLite then creates with the database's mode)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def client_umask() -> int:
    """This process's umask, read without changing it (threads may be creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def restore_client_umask(env: Mapping[str, str]) -> None:
    """In a job's own process: the umask of the client that submitted it, if *env* (the
    job's environment) carries it."""
    value = env.get(CLIENT_UMASK_VAR)
    if value:
        try:
            os.umask(int(value, 8) & 0o777)
        except ValueError:
            pass
