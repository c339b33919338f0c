"""Several processes for one job: start every rank, prefix its output, stop all if one fails.

Runs as ``python -m shoal.jobs._ranks PLAN.json`` (standard library only) in the job's process
group, so the supervisor's stop and kill reach every rank. The plan lists, for each rank, its
command, environment, working directory and label (``raw``: its output is prefixed already). The exit code is 0 when every rank exits 0,
otherwise that of the first rank that failed (128 + N for a rank killed by signal N).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["main"]


class _Rank:
    def __init__(self, index: int, spec: dict[str, Any]) -> None:
        self.index = index
        self.label = spec.get("label", f"rank {index}")
        self.proc = subprocess.Popen(
            spec["argv"], env=spec["env"], cwd=spec.get("cwd"), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_launcher)
        # A raw rank's lines come prefixed already (another host's own launcher).
        self.prefix = b"" if spec.get("raw") else f"[{self.label}] ".encode()
        self.partial = b""
        self.rc: int | None = None
        out = self.proc.stdout
        if out is None:  # Popen(stdout=PIPE) always sets it
            raise RuntimeError("rank has no output pipe")
        self.fd = out.fileno()
        os.set_blocking(self.fd, False)

    def emit(self, data: bytes, out: BinaryIO) -> None:
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            out.write(self.prefix + line + b"\n")

    def flush_partial(self, out: BinaryIO) -> None:
        if self.partial:
            out.write(self.prefix + self.partial + b"\n")
            self.partial = b""


def _read_ready(sel: selectors.BaseSelector, timeout: float, out: BinaryIO) -> int:
    """Copy what the ranks' pipes hold to *out* (waiting up to *timeout* for any); a pipe at
    its end has its partial line written and leaves *sel*. Returns how many ended."""
    ended = 0
    for key, _ in sel.select(timeout):
        rank: _Rank = key.data
        try:
            data = os.read(rank.fd, 65536)
        except BlockingIOError:
            continue
        if data:
            rank.emit(data, out)
        else:
            rank.flush_partial(out)
            sel.unregister(rank.fd)
            ended += 1
    return ended


_LAUNCHER_PID = os.getpid()


def _die_with_launcher() -> None:
    """In a rank, before its exec: die if this launcher dies (a killed launcher, e.g. on
    another host whose actor ended, never leaves ranks running). The launcher is
    single-threaded, so this runs safely between fork and exec."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != _LAUNCHER_PID:  # it died while this rank forked
            os._exit(70)


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def run(plan: dict[str, Any]) -> int:
    out = sys.stdout.buffer
    stop = {"asked": False}

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop["asked"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # A host launcher (``Supervisor.run_host``) holds these until the handlers are in place.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    ranks = [_Rank(i, spec) for i, spec in enumerate(plan["ranks"])]
    grace = float(plan.get("grace_seconds", 10.0))
    sel = selectors.DefaultSelector()
    for r in ranks:
        sel.register(r.fd, selectors.EVENT_READ, r)
    open_fds = len(ranks)
    first_failure: _Rank | None = None
    terminated_at: float | None = None
    while True:
        if stop["asked"] and terminated_at is None:
            out.write(b"[shoal] stop requested: stopping every rank\n")
            terminated_at = _signal_all(ranks, signal.SIGTERM)
        if terminated_at is not None and time.monotonic() > terminated_at + grace:
            _signal_all(ranks, signal.SIGKILL)
        open_fds -= _read_ready(sel, 0.2 if open_fds else 0.05, out)
        out.flush()
        for rank in ranks:
            if rank.rc is None and (rc := rank.proc.poll()) is not None:
                rank.rc = rc
                if rc != 0 and first_failure is None:
                    first_failure = rank
                    if terminated_at is None:
                        out.write(f"[shoal] {rank.label} exited with code {rc}; stopping the "
                                  "other ranks\n".encode())
                        terminated_at = _signal_all(ranks, signal.SIGTERM)
        if all(r.rc is not None for r in ranks) and open_fds == 0:
            break
        if all(r.rc is not None for r in ranks):
            # A rank's child may still hold its pipe: read what is there, then stop waiting.
            _read_ready(sel, 0.05, out)
            for r in ranks:
                r.flush_partial(out)
            break
    out.flush()
    if first_failure is not None and first_failure.rc is not None:
        return _exit_code(first_failure.rc)
    if stop["asked"]:
        return 128 + signal.SIGTERM
    return 0


def _signal_all(ranks: list[_Rank], sig: signal.Signals) -> float:
    for r in ranks:
        if r.proc.poll() is None:
            try:
                r.proc.send_signal(sig)
            except ProcessLookupError:
                pass
    return time.monotonic()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0]) as f:
        plan = json.load(f)
    return run(plan)


if __name__ == "__main__":
    sys.exit(main())
