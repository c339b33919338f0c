"""Process titles that say what a background process is: ``shoal launcher ~/.shoal``,
``shoal supervisor train-241130-ab12``, ``shoal warm-worker 3f2a…``, ``shoal endpoint NAME``.

With ``setproctitle`` installed the whole title shows in ``ps`` and ``top`` (its command
line); without it, and always, the kernel's 15-byte name (``/proc/PID/comm``, what ``ps -o
comm`` and ``pkill`` see) is set with ``prctl(PR_SET_NAME)``, e.g. ``shoal-supervis``.
Never raises: a title is a convenience.
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["set_title"]

_PR_SET_NAME = 15


def set_title(kind: str, name: str = "") -> None:
    """Title this process ``shoal KIND NAME`` (its comm ``shoal-KIND``, cut to 15 bytes)."""
    title = f"shoal {kind} {name}".strip()
    with contextlib.suppress(Exception):
        import setproctitle

        setproctitle.setproctitle(title)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            comm = f"shoal-{kind}".encode()[:15]
            ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(comm), 0, 0, 0)
