"""Extracting tar and zip archives safely: the one helper every part of shoal unpacks with.

An archive is extracted into a private sibling of its target and moved into place only when
every member is out, so a failure (a cap reached, a member that would escape, a full disk,
a corrupt stream) leaves nothing half-extracted behind. While extracting:

* members are read as a stream and counted; more than ``max_files`` stops at once;
* the bytes each member writes are counted before they are written (a tar member writes
  exactly the size its header declares, a zip member's bytes are counted as they are
  decompressed), so an archive of zeros that would expand to terabytes stops at
  ``max_bytes``, having written at most that much;
* absolute names, ``..``, links out of the tree and device files are refused (tarfile's
  ``"data"`` filter; the same checks by hand for zip).

The caps come from ``Settings`` (``max_extract_bytes`` / ``max_extract_files``, i.e.
``SHOAL_MAX_EXTRACT_BYTES`` / ``SHOAL_MAX_EXTRACT_FILES``) where a session is at hand, else
from those variables directly (the model server runs without pydantic).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

from shoal.errors import ConfigError, InvalidArgumentError, StorageError

if TYPE_CHECKING:
    import tarfile
    import zipfile

    from shoal._internal.settings import Settings

__all__ = ["DEFAULT_MAX_EXTRACT_BYTES", "DEFAULT_MAX_EXTRACT_FILES", "ExtractLimits",
           "extract_tar", "extract_zip"]

DEFAULT_MAX_EXTRACT_BYTES = 20 * 2**30
DEFAULT_MAX_EXTRACT_FILES = 100_000
_BYTES_VAR = "SHOAL_MAX_EXTRACT_BYTES"
_FILES_VAR = "SHOAL_MAX_EXTRACT_FILES"
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class ExtractLimits:
    """The most one archive may expand to: bytes written and members (files, dirs, links)."""

    max_bytes: int = DEFAULT_MAX_EXTRACT_BYTES
    max_files: int = DEFAULT_MAX_EXTRACT_FILES

    @classmethod
    def from_settings(cls, settings: Settings) -> ExtractLimits:
        return cls(int(settings.max_extract_bytes), int(settings.max_extract_files))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ExtractLimits:
        """The caps of ``SHOAL_MAX_EXTRACT_BYTES`` / ``_FILES`` (defaults where unset)."""
        if environ is None:
            from shoal.config import shoal_environ

            environ = shoal_environ()
        return cls(_positive(environ, _BYTES_VAR, DEFAULT_MAX_EXTRACT_BYTES),
                   _positive(environ, _FILES_VAR, DEFAULT_MAX_EXTRACT_FILES))


def _positive(environ: Mapping[str, str], var: str, default: int) -> int:
    text = environ.get(var, "").strip().replace("_", "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{var}={environ[var]!r} is not a positive whole number of "
                          f"{'bytes' if var == _BYTES_VAR else 'files'}", key=var)
    return value


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


class _Budget:
    """Counts what an archive has written so far; raises the moment a cap would be passed."""

    def __init__(self, limits: ExtractLimits, label: str) -> None:
        self.limits = limits
        self.label = label
        self.files = 0
        self.bytes = 0

    def member(self) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise InvalidArgumentError(
                f"{self.label} holds more than {self.limits.max_files} files, the cap on what "
                f"one archive may unpack; shoal stopped there and removed what it had "
                f"extracted. If the archive is meant to be that large, raise the cap with "
                f"{_FILES_VAR} (Settings max_extract_files)",
                archive=self.label, limit=self.limits.max_files, setting=_FILES_VAR)

    def take(self, n: int) -> None:
        if self.bytes + n > self.limits.max_bytes:
            cap = self.limits.max_bytes
            raise InvalidArgumentError(
                f"{self.label} expands to more than {_size(cap)} ({cap} bytes), the cap on "
                f"what one archive may unpack (a decompression bomb, or a model larger than "
                f"the cap); shoal stopped after {self.files} member(s) and removed what it had "
                f"extracted. If the archive is meant to be that large, raise the cap with "
                f"{_BYTES_VAR} (Settings max_extract_bytes)",
                archive=self.label, limit=cap, setting=_BYTES_VAR)
        self.bytes += n


@contextlib.contextmanager
def _staging(target: Path, label: str) -> Iterator[Path]:
    """A private directory beside *target* to extract into; moved into place on success,
    removed on any failure."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.extracting-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        try:
            yield tmp
        except OSError as e:
            raise StorageError(f"cannot extract {label} into {target}: {e.strerror or e}"
                               + (" (the disk is full: free space, or extract elsewhere)"
                                  if e.errno == 28 else ""),
                               archive=label, path=str(target)) from e
        _move_into(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into(tmp: Path, target: Path) -> None:
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if not target.exists():
        os.rename(tmp, target)
        return
    for child in tmp.iterdir():  # into an existing directory: what the archive holds wins
        dest = target / child.name
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        os.rename(child, dest)


# --- tar --------------------------------------------------------------------------------

def extract_tar(archive: Path | str | IO[bytes], target: Path | str, *,
                limits: ExtractLimits | None = None, label: str | None = None) -> None:
    """Extract the tar (any compression) *archive*, a path or a seekable binary file object,
    into *target*, within *limits*.

    Raises InvalidArgumentError for a cap reached, an unsafe member or an unreadable archive,
    StorageError when the disk refuses; nothing is left extracted either way.
    """
    import gzip
    import tarfile
    import zlib

    limits = limits or ExtractLimits.from_environ()
    name = label or (str(archive) if isinstance(archive, str | Path) else "the tar archive")
    budget = _Budget(limits, name)
    with _staging(Path(target), name) as tmp:
        try:
            with (tarfile.open(archive) if isinstance(archive, str | Path)
                  else tarfile.open(fileobj=archive)) as tar:
                members = _counted(tar, budget)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(tmp, members=members, filter="data")
                else:  # Python < 3.11.4: the same checks by hand
                    tar.extractall(tmp, members=_checked(members, tmp, name))
        except getattr(tarfile, "FilterError", ()) as e:
            member = getattr(e, "tarinfo", None)
            raise InvalidArgumentError(
                f"refusing to extract {name}: its member "
                f"{getattr(member, 'name', '?')!r} would land outside the target directory "
                f"or is not a plain file or directory ({e})", archive=name) from e
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            # a corrupt or truncated stream (gzip raises its own, and EOFError, mid-member)
            raise InvalidArgumentError(f"{name} is not a readable tar archive: "
                                       f"{type(e).__name__}: {e}", archive=name) from e


def _counted(tar: tarfile.TarFile, budget: _Budget) -> Iterator[tarfile.TarInfo]:
    """The members as the stream yields them, each counted before tarfile writes it (a
    member writes exactly the size its header declares)."""
    for member in tar:
        budget.member()
        if member.isreg():
            budget.take(member.size)
        yield member


def _checked(members: Iterator[tarfile.TarInfo], root: Path, name: str
             ) -> Iterator[tarfile.TarInfo]:
    root = root.resolve()
    for member in members:
        dest = (root / member.name).resolve()
        bad_link = (member.issym() or member.islnk()) and not (
            dest.parent / member.linkname).resolve().is_relative_to(root)
        if not dest.is_relative_to(root) or bad_link or member.isdev():
            raise InvalidArgumentError(f"refusing to extract {name}: its member "
                                       f"{member.name!r} would land outside the target "
                                       "directory", archive=name, member=member.name)
        yield member


# --- zip --------------------------------------------------------------------------------

def extract_zip(source: Path | str | IO[bytes], target: Path | str, *,
                limits: ExtractLimits | None = None, label: str | None = None) -> None:
    """Extract the zip *source* (a path or a binary file object) into *target*, within
    *limits*; entry names are all checked before anything is written. Executable bits are
    kept; symlink entries become plain files."""
    import zipfile
    import zlib

    limits = limits or ExtractLimits.from_environ()
    name = label or (str(source) if isinstance(source, str | Path) else "the zip archive")
    budget = _Budget(limits, name)
    try:
        with zipfile.ZipFile(source) as zf:
            infos = zf.infolist()
            for info in infos:
                _check_zip_name(info.filename, name)
            with _staging(Path(target), name) as tmp:
                for info in infos:
                    budget.member()
                    _write_zip_entry(zf, info, tmp, budget)
    except (zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise InvalidArgumentError(f"{name} is not a readable zip archive: "
                                   f"{type(e).__name__}: {e}", archive=name) from e


def _write_zip_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, root: Path, budget: _Budget
                     ) -> None:
    dest = root.joinpath(*PurePosixPath(info.filename.replace("\\", "/")).parts)
    if info.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(info) as src, open(dest, "wb") as out:
        while chunk := src.read(_CHUNK):
            budget.take(len(chunk))
            out.write(chunk)
    if (info.external_attr >> 16) & 0o111:
        dest.chmod(dest.stat().st_mode | 0o111)


def _check_zip_name(entry: str, name: str) -> None:
    parts = entry.replace("\\", "/").split("/")
    if entry.startswith(("/", "\\")) or (len(entry) > 1 and entry[1] == ":") or ".." in parts:
        raise InvalidArgumentError(
            f"refusing to extract {name}: its entry {entry!r} would land outside the target "
            "directory (absolute paths and '..' are not allowed)", archive=name, entry=entry)
