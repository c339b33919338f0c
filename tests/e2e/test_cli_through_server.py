"""Every ``shoal`` command with a team server set: each is listed in one table of
``shoal.cli._remote`` (this walks the command tree, so a new one cannot be forgotten); the
refused ones say why and what to run instead; the ones through the server work there (gc,
jobs delete and workers on the server's own stores and host, gc limited to one's own
records)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from shoal.cli import _remote


def _leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[str]:
    """Every runnable command path under *command* (typer's click command tree)."""
    if hasattr(command, "commands"):  # a group (typer carries its own copy of click)
        if command.invoke_without_command and path:  # 'shoal server' runs by itself too
            yield " ".join(path)
        for name, sub in command.commands.items():
            yield from _leaves(sub, (*path, name))
    else:
        yield " ".join(path)


def test_every_command_says_what_it_does_through_a_team_server():
    from shoal.cli._app import app

    commands = set(_leaves(typer.main.get_command(app)))
    tables = [_remote.THROUGH_SERVER, _remote.ON_THIS_MACHINE, set(_remote.REFUSED)]
    listed = [c for table in tables for c in table]
    assert len(listed) == len(set(listed)), "a command is in two tables of shoal.cli._remote"
    missing = sorted(commands - set(listed))
    assert not missing, f"add these to a table of shoal/cli/_remote.py: {missing}"
    assert not set(listed) - commands, "shoal.cli._remote lists commands that do not exist"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Shell:
    """A client machine's shell: a home and config directory of its own, *env* added."""

    def __init__(self, root: Path, **env: str) -> None:
        self.home = root / "home"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        self.env.update(SHOAL_HOME=str(self.home), XDG_CONFIG_HOME=str(root / "xdg"),
                        OMP_NUM_THREADS="1", SHOAL_STORE_OUTAGE_SECONDS="0", **env)

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=self.env,
                              cwd=cwd, capture_output=True, text=True, timeout=300,
                              check=False, stdin=subprocess.DEVNULL)

    def ok(self, *args: str, **kwargs: Any) -> str:
        done = self.run(*args, **kwargs)
        assert done.returncode == 0, (args, done.stdout + done.stderr)
        return done.stdout


_REFUSED_ARGS = {"demo": ["demo"], "db upgrade": ["db", "upgrade"],
                 "envs list": ["envs", "list"], "envs prune": ["envs", "prune"],
                 "server": ["server", "--port", "1"], "server init": ["server", "init"],
                 "ui": ["ui", "--port", "1"]}


def test_commands_that_make_no_sense_remotely_say_why_and_what_to_run(tmp_path):
    assert set(_REFUSED_ARGS) == set(_remote.REFUSED)
    url = f"http://127.0.0.1:{_closed_port()}"  # refused before anything is sent
    shell = _Shell(tmp_path, SHOAL_SERVER_URL=url)
    for command, args in _REFUSED_ARGS.items():
        done = shell.run(*args)
        assert done.returncode == 4, (command, done.stderr)  # a configuration error
        said = " ".join(done.stderr.split())
        assert f"this shell uses the team server {url}" in said, (command, said)
        assert " ".join(_remote.REFUSED[command].split()) in said, (command, said)
    assert not (shell.home / "shoal.db").exists()  # nothing opened here


def _token(server: Any, user: str, name: str, *extra: str) -> str:
    made = server.cli("tokens", "create", "--user", user, "--name", name, "--create-user",
                      *extra)
    assert made.returncode == 0, made.stderr
    return str(made.stdout.strip())


def test_gc_through_the_server_removes_only_the_callers_own_unless_an_admin(shoal_server,
                                                                            tmp_path):
    from shoal.client import HttpRunStore
    from shoal.core.experiments import RunStatus

    tokens = {u: _token(shoal_server, u, "gc", "--scope", "write") for u in ("gia", "hal")}
    for user, token in tokens.items():
        with HttpRunStore.open(shoal_server.url, token) as store:
            store.ensure_experiment(f"gc-{user}")
            store.create_run(f"gc-{user}", "old")
            store.end_run(f"gc-{user}", "old", status=RunStatus.COMPLETED)
    admin = _Shell(tmp_path / "admin", SHOAL_SERVER_URL=shoal_server.url,
                   SHOAL_TOKEN=shoal_server.admin_token)
    planned = json.loads(admin.ok("gc", "--older-than", "0s", "--dry-run", "--json"))
    runs = {(r["experiment_name"], r["run_name"]) for r in planned["runs"]}
    assert {("gc-gia", "old"), ("gc-hal", "old")} <= runs and planned["dry_run"]
    gia = _Shell(tmp_path / "gia", SHOAL_SERVER_URL=shoal_server.url, SHOAL_TOKEN=tokens["gia"])
    done = json.loads(gia.ok("gc", "--older-than", "0s", "--json"))
    assert [(r["experiment_name"], r["run_name"]) for r in done["runs"]] == [("gc-gia", "old")]
    assert done["experiments"] == ["gc-gia"]
    listed = gia.ok("experiments", "list")
    assert "gc-hal" in listed and "gc-gia" not in listed  # hal's stays
    assert not (gia.home / "shoal.db").exists()


def test_jobs_delete_and_workers_work_on_the_servers_host(own_shoal_server, tmp_path):
    _, url, server_home = own_shoal_server()
    init = subprocess.run([sys.executable, "-m", "shoal.cli", "server", "init"],
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith("SHOAL_")},
                               "SHOAL_HOME": str(server_home),
                               "XDG_CONFIG_HOME": str(server_home / "xdg-config")},
                          capture_output=True, text=True, timeout=120, check=False)
    assert init.returncode == 0, init.stderr
    admin = _Shell(tmp_path / "admin", SHOAL_SERVER_URL=url, SHOAL_TOKEN=init.stdout.strip())
    work = tmp_path / "work"
    work.mkdir()
    admin.ok("jobs", "submit", "--name", "audit", "--", "python", "-c", "print('audited')",
             cwd=work)
    [job] = [r["name"] for r in json.loads(admin.ok("jobs", "list", "--json"))
             if r["name"].startswith("audit-")]
    assert "audited" in admin.ok("jobs", "logs", job)
    assert job in admin.ok("jobs", "describe", job)
    admin.ok("jobs", "metrics", job)
    assert "has already ended" in admin.ok("jobs", "cancel", job)
    workers = json.loads(admin.ok("workers", "list", "--json"))
    assert any(w["kind"] == "launcher" and w["home"] == str(server_home) for w in workers)
    removed = json.loads(admin.ok("jobs", "delete", job, "--json"))
    assert removed["jobs"] == [job] and removed["bytes"] > 0
    assert admin.run("jobs", "describe", job).returncode == 3  # gone from the server
    stopped = admin.ok("workers", "stop", "--all")
    assert "launcher" in stopped and f"on the server {url}" in stopped
    assert json.loads(admin.ok("workers", "list", "--json")) == []
    assert not (admin.home / "shoal.db").exists()  # nothing on the client's own stores
