"""A private directory for sockets whose natural path is too long for AF_UNIX (108 bytes)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from shoal.errors import BackendError

__all__ = ["private_socket_dir"]


def private_socket_dir() -> Path:
    """``$XDG_RUNTIME_DIR/shoal`` or ``/tmp/shoal-<uid>``, refused unless it is a real directory
    owned by this user and closed to others (another user could otherwise pre-create it and
    receive our requests, environments included)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "shoal" if base else Path(tempfile.gettempdir()) / f"shoal-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise BackendError(f"cannot use {path} for shoal's sockets: {e}", path=str(path)) from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise BackendError(
            f"{path} is not a private directory of this user (owner uid {st.st_uid}, mode "
            f"{stat.filemode(st.st_mode)}); remove it, or give SHOAL_HOME a shorter path",
            path=str(path))
    return path
