"""Ending every process a job started, including those that left its session.

A child started with ``start_new_session=True``, or a daemon that forked twice, leaves the
job's process group, so ``killpg`` misses it, and once its parent exits it is adopted by init
and runs on after the job. A process that is a *child subreaper* (Linux's
``PR_SET_CHILD_SUBREAPER``) adopts such orphans instead: every process a job started stays
among its descendants, which ``end_descendants`` finds (``/proc``), stops (SIGTERM, then
SIGKILL after a grace period) and reaps. The supervisor, the zygote and each zygote job are
subreapers (see ``docs/architecture.md``, "Process hygiene").

Standard library only: it runs in a job's own interpreter too (the zygote).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctypes import _CArgObject  # what ctypes.byref() returns (typeshed's name)

__all__ = ["become_subreaper", "descendants", "end_descendants", "not_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_LIBC = None


def _prctl(option: int, arg: int | _CArgObject) -> bool:
    global _LIBC
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        return int(_LIBC.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper(on: bool = True) -> bool:
    """Adopt the orphans among this process's descendants (Linux); False where unsupported."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, int(on))


def _is_subreaper() -> bool:
    value = ctypes.c_int(0)
    return _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value)) and bool(value.value)


@contextlib.contextmanager
def not_subreaper() -> Iterator[None]:
    """While starting a daemon that is not the job's (a zygote shared by many jobs): it
    detaches by forking, and must then go to init, not to us."""
    was = _is_subreaper()
    if was:
        become_subreaper(False)
    try:
        yield
    finally:
        if was:
            become_subreaper(True)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of *pid*, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def _children(pid: int) -> list[int] | None:
    """Direct children of *pid* from ``/proc/<pid>/task/*/children`` (None where the kernel
    lacks that file)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
    return out


def _tree_by_scan() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            tree.setdefault(st[1], []).append(int(entry))
    return tree


def descendants(root: int | None = None, spare: Collection[int] = (),
                keep: Collection[int] = ()) -> list[int]:
    """Every live descendant of *root* (default: this process), parents before children;
    the pids in *spare* are left out, but not their descendants; those in *keep* are left
    out with all of theirs. Zombies are left out too (their parents reap them; ours are
    reaped by ``end_descendants``)."""
    root = os.getpid() if root is None else root
    if not os.path.isdir("/proc/self"):
        return []
    tree: dict[int, list[int]] | None = None
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = _children(pid) if tree is None else tree.get(pid, [])
        if kids is None:  # no children files: one scan of /proc for the whole walk
            tree = _tree_by_scan()
            found.clear()
            todo = [root]
            continue
        for kid in kids:
            if kid in keep:
                continue
            todo.append(kid)
            st = _stat(kid)
            if kid not in spare and st is not None and st[0] not in ("Z", "X"):
                found.append(kid)
    return found


def _signal_all(pids: Collection[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap_ours(spare: Collection[int]) -> None:
    """Reap this process's exited children, except those in *spare* (whose exit status
    belongs to whoever watches them)."""
    me = os.getpid()
    kids = _children(me)
    for kid in _tree_by_scan().get(me, []) if kids is None else kids:
        if kid in spare:
            continue
        st = _stat(kid)
        if st is not None and st[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(kid, os.WNOHANG)


def end_descendants(grace: float, spare: Collection[int] = (), root: int | None = None,
                    keep: Collection[int] = ()) -> int:
    """SIGTERM every descendant of *root* (this process) but *spare* and the trees of
    *keep*, SIGKILL those left after *grace* seconds, reap our own; returns how many there
    were. Costs one walk of ``/proc`` when there are none."""
    found = descendants(root, spare, keep)
    if not found:
        _reap_ours(spare)
        return 0
    _signal_all(found, signal.SIGTERM)
    term_deadline = time.monotonic() + max(0.0, grace)
    kill_deadline = term_deadline + 10.0
    killed = False
    ended = set(found)
    while True:
        _reap_ours(spare)
        left = descendants(root, spare, keep)
        ended.update(left)
        if not left:
            return len(ended)
        now = time.monotonic()
        if now >= term_deadline:
            _signal_all(left, signal.SIGKILL)  # also what was started since the SIGTERM
            if killed and now >= kill_deadline:
                return len(ended)  # unkillable (uninterruptible sleep): give up, bounded
            killed = True
        time.sleep(0.01)  # bounded poll: processes on their way out
