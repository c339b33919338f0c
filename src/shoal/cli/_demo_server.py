"""``shoal demo``, the team server: ``shoal server init`` makes the first admin's token,
``shoal server`` serves this interpreter's stores in a home of its own, and a client that has
only the server's URL and a token submits a job through it: the job runs on the server's
host under the server's home, the client's home stays empty, and the record names its owner.
A wrong token is refused saying so. Each step is ``python -m shoal.cli ...`` of this
interpreter, its output trimmed.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from shoal.cli._context import out
from shoal.config import child_environ
from shoal.errors import ShoalError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["run_server_demo"]

_CLIENT_VARS = ("SHOAL_SERVER_URL", "SHOAL_TOKEN", "SHOAL_METADATA_URL", "SHOAL_ARTIFACT_URL",
                "SHOAL_HOME")


def _heading(number: int, title: str) -> None:
    out().print()
    out().print(Text(f"{number}. {title}", style="bold cyan"))


def _note(text: str, style: str = "dim") -> None:
    out().print(Text(f"   {text}", style=style))


def _env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in child_environ(COLUMNS="120").items() if k not in _CLIENT_VARS}
    return {**env, **overrides}


def _shoal(env: Mapping[str, str], cwd: Path, *args: str, ok: bool = True,
           merged: bool = False) -> str:
    """Its standard output (*merged*: with its standard error; not *ok*: its message)."""
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=dict(env), cwd=cwd,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True,
                          timeout=120)
    if ok and proc.returncode != 0:
        raise ShoalError(f"the demo ran shoal {' '.join(args)}: exit {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    return proc.stdout if ok else (proc.stderr or proc.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_answers(proc: subprocess.Popen[bytes], url: str, log: Path, seconds: float) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise ShoalError(f"shoal server exited with {proc.returncode}; its log {log} ends "
                             f"with: {log.read_text(errors='replace')[-600:]}")
        try:
            if httpx.get(f"{url}/api/v1/version", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise ShoalError(f"shoal server at {url} did not answer within {seconds:.0f} s; "
                             f"its log: {log}")
        time.sleep(0.05)  # bounded polling of a process starting up


def run_server_demo(number: int) -> None:
    _heading(number, "the team server: a job submitted through it runs on the server's host")
    with tempfile.TemporaryDirectory(prefix="shoal-demo-team-") as tmp:
        root = Path(tmp)
        server_home, client_home, cwd = root / "server", root / "client", root / "project"
        cwd.mkdir()
        admin = _env(SHOAL_HOME=str(server_home))
        token = _shoal(admin, cwd, "server", "init", "--user", "alice").strip()
        _note(f"shoal server init: admin 'alice', her token shown once ({token[:10]}…)")
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = root / "server.log"
        started = time.monotonic()
        with open(log, "wb") as f:
            proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "server", "--port",
                                     str(port)], env=admin, cwd=cwd, stdin=subprocess.DEVNULL,
                                    stdout=f, stderr=subprocess.STDOUT)
        try:
            _wait_answers(proc, url, log, 60)
            _note(f"shoal server answers at {url}/api/v1 after "
                  f"{time.monotonic() - started:.1f}s (stores: its own home)")
            _client_steps(_env(SHOAL_SERVER_URL=url, SHOAL_TOKEN=token,
                               SHOAL_HOME=str(client_home)), cwd, server_home, client_home)
            _console_note(url)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _client_steps(client: dict[str, str], cwd: Path, server_home: Path,
                  client_home: Path) -> None:
    submitted = _shoal(client, cwd, "jobs", "submit", "--name", "team-hello", "--follow", "--",
                       sys.executable, "-c",
                       "import os, socket; print('hello from', socket.gethostname(), "
                       "'in', os.getcwd())", merged=True)
    name = next((line.split()[1] for line in submitted.splitlines()
                 if line.startswith("job ") and line.rstrip().endswith("completed")), None)
    for line in submitted.splitlines():
        if line.strip():
            _note(f"client$ {line.strip()[:110]}", "")
    if name is None:
        raise ShoalError(f"the demo's job through the server did not complete: {submitted}")
    described = _shoal(client, cwd, "jobs", "describe", name)
    shown = [line.strip() for line in described.splitlines()
             if line.strip().split(" ", 1)[0] in ("status", "owner", "backend")]
    for line in shown:
        _note(f"jobs describe: {' '.join(line.split())}", "")
    _note(f"the job's work directory is on the server ({(server_home / 'work').is_dir()}); the "
          f"client's home holds nothing ({not client_home.exists()}): no database, no S3 "
          "credential, no user secret on the client")
    refused = _shoal({**client, "SHOAL_TOKEN": "shoal_not-a-real-token"}, cwd, "jobs", "list",
                     ok=False).strip().splitlines()
    _note(f"a wrong token: {refused[-1][:110] if refused else '(no message)'}", "yellow")


def _console_note(url: str) -> None:
    """Where the server's web console is, once it has sent a visitor to its login page."""
    import httpx

    answer = httpx.get(f"{url}/console/jobs", timeout=10)
    where = answer.headers.get("location", "")
    if answer.status_code != 303 or "/console/login" not in where:
        raise ShoalError(f"the server's console at {url}/console/ did not ask for a login: "
                         f"HTTP {answer.status_code} {where}")
    _note(f"its web console: {url}/console/ (sign in with a token; a visitor is sent to "
          f"{where.split('?')[0]})")
