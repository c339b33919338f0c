"""``shoal demo``, security and the CLI for what runs.

Security: the user secret is a 0600 file outside every store and a job's record holds only
the salt its key is derived with; a secret-looking environment variable is masked in ``jobs
describe`` and in the job's log even when printed in two pieces; the home is 0700.

The CLI: a command submitted as a job, the background processes, and ``gc --dry-run``, each run
as ``python -m shoal.cli --home HOME ...`` of this interpreter, their output trimmed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from shoal import remote
from shoal.cli._context import out, state
from shoal.config import child_environ
from shoal.core.ports import JobQuery
from shoal.errors import ShoalError

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["run_cli_demo", "run_security_demo"]

#: Not a real secret: a value long enough to be masked, under a secret-looking name.
_TOKEN_NAME, _TOKEN = "DEMO_API_TOKEN", "demo-tok-7Qx2Lm9Vb4Rz"


def _heading(number: int, title: str) -> None:
    out().print()
    out().print(Text(f"{number}. {title}", style="bold cyan"))


def _note(text: str, style: str = "dim") -> None:
    out().print(Text(f"   {text}", style=style))


def _mode(path: Path) -> str:
    return f"{stat.S_IMODE(path.stat().st_mode):04o}"


def _cli(session: Session, *args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(session.home),
                           *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL, env=child_environ(COLUMNS="120"))
    if proc.returncode != 0:
        raise ShoalError(f"the demo ran shoal {' '.join(args)} exited {proc.returncode}: "
                           f"{proc.stdout.strip()[-400:]}")
    return proc.stdout


def print_in_pieces(name: str) -> str:
    """The variable's value written in two pieces: a write and a flush, a pause, the rest."""
    import sys
    import time

    value = os.environ[name]
    sys.stdout.write(f"{name}={value[:6]}")
    sys.stdout.flush()
    time.sleep(0.3)  # the supervisor reads the first piece on its own
    print(f"{value[6:]} (end of the value)", flush=True)
    return f"printed {len(value)} characters"


def run_security_demo(session: Session, number: int) -> None:
    _heading(number, "security: no job key stored, secrets masked, a private home")
    secret_file = Path(session.settings.user_secret_path())
    result = remote(print_in_pieces, environment_variables={_TOKEN_NAME: _TOKEN})(_TOKEN_NAME)
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="print-in-pieces-", limit=1))
    name = record.name
    _note(f"user secret {secret_file}: mode {_mode(secret_file)} in a "
          f"{_mode(secret_file.parent)} directory, {secret_file.stat().st_size} bytes, in no "
          "store", style="")
    salt = session.metadata.get_job_key_salt(name)
    key = session.jobs.job_secret(name)
    raw = _raw_row(session, name)
    if raw is None:
        _note(f"job {name}: key salt {salt} on its record; its key is derived from the secret")
    else:
        columns, text = raw
        found = [what for what, value in (("its derived key", key), (_TOKEN_NAME, _TOKEN))
                 if value in text]
        salts = ", ".join(c for c in columns if "key" in c)
        _note(f"job {name}: its row ({len(columns)} columns) has {salts} = {salt} and no key; "
              + (f"LEAKED: {' and '.join(found)} in it" if found else
                 "neither the job's derived key nor the token's value appears in it"),
              style="red" if found else "")
    _note(f"job {name} {result!r}; {_TOKEN_NAME}={_TOKEN[:4]}... set with "
          "environment_variables= (stored encrypted):")
    described = [line.strip() for line in _cli(session, "jobs", "describe", name).splitlines()
                 if _TOKEN_NAME in line]
    logged = [line.strip() for line in _cli(session, "jobs", "logs", name).splitlines()
              if _TOKEN_NAME in line]
    for where, lines in (("jobs describe", described), ("jobs logs", logged)):
        shown = " | ".join(lines) or "(no line names it)"
        leaked = any(_TOKEN in line or _TOKEN[6:] in line for line in lines)
        _note(f"shoal jobs {where.split()[1]}: {shown}"
              f"{'  LEAKED' if leaked else ''}", style="red" if leaked else "")
    home = Path(session.home)
    files = ", ".join(f"{p.name} {_mode(p)}" for p in (home / "shoal.db", home / "logs")
                      if p.exists())
    _note(f"home {home}: mode {_mode(home)}" + (f" ({files})" if files else ""), style="")
    _note(f"find it again: shoal {state.home_option()}jobs describe {name}")


def _raw_row(session: Session, name: str) -> tuple[list[str], str] | None:
    """The job's row as stored (column names, its text), for the SQLite default; else None."""
    db = Path(session.home) / "shoal.db"
    if not str(session.settings.resolved_metadata_url()).startswith("sqlite") or not db.exists():
        return None
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        cursor = conn.execute("SELECT * FROM jobs WHERE name = ?", (name,))
        row = cursor.fetchone()
        columns = [d[0] for d in cursor.description]
    return columns, json.dumps(list(row), default=str)


def run_cli_demo(session: Session, number: int) -> None:
    _heading(number, "the CLI for what runs: jobs submit, workers list, gc --dry-run")
    with tempfile.TemporaryDirectory(prefix="shoal-demo-cli-") as tmp:
        # submit ships the current directory as the job's source: an empty one here
        submitted = _cli(session, "jobs", "submit", "--name", "hello", "--follow", "--",
                         "python", "-c", "print('hello from a command job')", cwd=Path(tmp))
    _note("$ shoal jobs submit --name hello --follow -- python -c \"print('hello from a "
          "command job')\"", style="")
    for line in submitted.rstrip().splitlines():
        _note(f"  {line}")
    listed = _cli(session, "workers", "list").rstrip().splitlines()
    _note("$ shoal workers list", style="")
    for line in listed[:6]:
        _note(f"  {line}")
    if len(listed) > 6:
        _note(f"  ... {len(listed) - 6} more")
    before = len(session.metadata.list_jobs(JobQuery(limit=10_000)))
    gc = _cli(session, "gc", "--older-than", "0s", "--dry-run").rstrip().splitlines()
    after = len(session.metadata.list_jobs(JobQuery(limit=10_000)))
    _note("$ shoal gc --older-than 0s --dry-run", style="")
    for line in [*gc[:2], *([f"... {len(gc) - 3} more like these"] if len(gc) > 3 else []),
                 gc[-1]] if len(gc) > 2 else gc:
        _note(f"  {line}")
    _note(f"jobs recorded before {before}, after {after}: the dry run deleted nothing",
          style="" if before == after else "red")
