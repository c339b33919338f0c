"""What a failing metadata database means, in words a person can act on.

SQLite says "attempt to write a readonly database", "database or disk is full", "disk I/O
error", "unable to open database file" or "file is not a database"; each has its own cause
and remedy, and none of them is "check that the server runs" (that is PostgreSQL's). The
SQLite error code (``sqlite3.Error.sqlite_errorcode``) tells them apart; the file system
(free space, a read-only mount, a missing or unwritable directory) says which it is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from shoal.errors import MetadataStoreError, SchemaOutOfDateError

__all__ = ["explain", "make_parent", "newer_revision_error", "refuse_newer", "sqlite_path"]

_READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 8, 10, 11, 13, 14, 26
_BUSY, _LOCKED = 5, 6
_LOW_SPACE = 4 * 2**20


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (``file:`` URI form too); None for other databases."""
    import sqlalchemy as sa

    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return None
    db = parsed.database
    if parsed.get_backend_name() != "sqlite" or not db or db == ":memory:":
        return None
    if db.startswith("file:"):
        db = db[len("file:"):].split("?", 1)[0]
    return Path(db)


def explain(error: BaseException, url: str, shown: str, *, doing: str) -> MetadataStoreError:
    """A MetadataStoreError for *error* (a DB-API error, or SQLAlchemy's wrapper of one) met
    while *doing* something ("open", "write to"...) with the database at *url*."""
    orig = getattr(error, "orig", None) or error
    path = sqlite_path(url)
    code = getattr(orig, "sqlite_errorcode", None)
    if path is None or code is None:
        # A server that cannot be reached (stopped, restarting, failing over): worth waiting
        # for (storage/outage.py). PostgreSQL's OperationalError covers a refused connection
        # and one the server ended; an error in the SQL itself is not one.
        transient = path is None and any(c.__name__ in ("OperationalError", "InterfaceError")
                                         for c in type(orig).__mro__)
        if doing == "open" and type(orig).__name__ == "OperationalError":  # PostgreSQL's
            return MetadataStoreError(
                f"cannot open metadata database {shown}: {orig}. Check that the server runs "
                f"and the database exists (createdb), then run 'shoal db upgrade {shown}'.",
                url=shown, transient=transient)
        return MetadataStoreError(f"cannot {doing} the metadata database {shown}: {orig}",
                                  url=shown, transient=transient)
    said = f"(SQLite: {orig})"
    what = _sqlite_text(code & 0xFF, path, said, doing)
    return MetadataStoreError(what, url=shown, path=str(path),
                              sqlite_error=getattr(orig, "sqlite_errorname", None))


def _sqlite_text(code: int, path: Path, said: str, doing: str) -> str:
    folder = path.parent
    fs = _file_system(folder)
    if code in (_NOTADB, _CORRUPT):
        return (f"{path} is not a valid SQLite database {said}: the file is damaged or is some "
                f"other kind of file. Move it aside (mv {path} {path}.broken, with its -wal and "
                f"-shm files if any) and shoal creates a new, empty one on the next call; the "
                f"jobs, runs and endpoints it recorded are then only in that copy or a backup")
    if code == _FULL or fs == "full":
        return (f"cannot {doing} the metadata database {path}: the disk holding it is full "
                f"{said}; {_free(folder)}. Free space on that file system (or move SHOAL_HOME "
                f"elsewhere) and try again")
    if fs == "read-only":
        return (f"cannot {doing} the metadata database {path}: {folder} is on a read-only "
                f"file system {said}. shoal writes the database and its -wal and -shm files "
                f"there: mount it read-write, or point SHOAL_HOME / SHOAL_METADATA_URL at a "
                f"writable place")
    if code == _READONLY:
        return (f"cannot {doing} the metadata database {path}: the file is read-only for "
                f"this process {said} (its permissions, an immutable flag, or a read-only "
                f"open). Make {path} and {folder} writable by this user, or point "
                f"SHOAL_METADATA_URL at a writable database")
    if code == _CANTOPEN:
        why = ("the directory does not exist" if fs == "missing"
               else f"{folder} is not writable by this user" if fs == "unwritable"
               else "the file or its directory cannot be opened")
        return (f"cannot open the metadata database {path}: {why} {said}. Create the "
                f"directory or make it writable, or point SHOAL_HOME / SHOAL_METADATA_URL "
                f"elsewhere")
    if code == _IOERR:
        return (f"cannot {doing} the metadata database {path}: the disk reported an I/O "
                f"error {said}; {_free(folder)}. Check the disk (dmesg) and its free space")
    if code in (_BUSY, _LOCKED):
        return (f"the metadata database {path} stayed locked by another process for over "
                f"60 s {said}; find what holds it (fuser {path}) and try again")
    return f"cannot {doing} the metadata database {path} {said}"


def _file_system(folder: Path) -> str:
    """full | read-only | missing | unwritable | ok: what the folder's file system says."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return "missing"
    if st.f_flag & os.ST_RDONLY:
        return "read-only"
    if st.f_bavail * st.f_frsize < _LOW_SPACE and st.f_blocks > 0:
        return "full"
    if not os.access(folder, os.W_OK):
        return "unwritable"
    return "ok"


def _free(folder: Path) -> str:
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return "its free space is unknown"
    return f"{usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.0f} MiB there"


def newer_revision_error(revision: str, shown: str, expected: str) -> SchemaOutOfDateError:
    """The database was migrated by a newer shoal: no 'shoal db upgrade' of this one helps."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = f"shoal {version('shoal')}"
    except PackageNotFoundError:
        mine = "this shoal"
    return SchemaOutOfDateError(
        f"metadata database {shown} was written by a newer shoal: its schema is at revision "
        f"{revision}, and {mine} knows revisions up to {expected}. Upgrade shoal (pip install "
        f"-U shoal) on this machine to use it, or point SHOAL_METADATA_URL at another "
        f"database; 'shoal db upgrade' cannot move a database back", url=shown,
        revision=revision, expected=expected, newer=True)


def known_revisions(migrations: Path) -> set[str]:
    """Every revision of this code's migrations (from their files, without loading Alembic)."""
    import re

    found = set()
    for file in migrations.glob("versions/*.py"):
        m = re.search(r'^revision\s*=\s*["\']([^"\']+)["\']', file.read_text(), re.M)
        if m:
            found.add(m.group(1))
    return found


def refuse_newer(revision: Any, shown: str, migrations: Path, expected: str) -> None:
    """Raise when *revision* is none of this code's migrations: a newer shoal wrote it."""
    if revision and str(revision) not in known_revisions(migrations):
        raise newer_revision_error(str(revision), shown, expected)


def make_parent(db: Path) -> None:
    """The SQLite file's directory, created; an error naming it when that is refused."""
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MetadataStoreError(f"cannot create {db.parent} for the metadata database {db}: "
                                 f"{e.strerror}; create it, or point SHOAL_HOME / "
                                 f"SHOAL_METADATA_URL elsewhere", path=str(db)) from e
