"""The caller's working directory packed into a deterministic zip for a job, and unpacked there.

Every file under the root ships (not only ``.py``), minus ``ALWAYS_SKIPPED``, ``.gitignore``
matches (root and nested) and a ``file_filter``: a ``CustomFileFilter`` (fnmatch on each name, or
on the relative path when a pattern holds ``/``) or a ``shutil.copytree``-style ``ignore``
callable. Entries are sorted, dated 1980-01-01, mode 0644/0755: same content, same bytes. A link
to a file inside the root ships as that file; links leading outside the root, and directory links
(duplicates, or loops), are skipped. Empty directories do not ship. The size limit is checked
while walking, before anything is read or compressed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import heapq
import io
import itertools
import os
import stat
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pathspec

from shoal.errors import InvalidArgumentError

__all__ = ["ALWAYS_SKIPPED", "PackedWorkdir", "pack_workdir", "unpack_workdir"]

ALWAYS_SKIPPED = (  # never shipped; gitignore syntax (a trailing / names directories only)
    ".git/",
    "__pycache__/",
    "*.pyc",
    ".venv/",
    "venv/",
    ".ipynb_checkpoints/",
    ".shoal/",
)
_ALWAYS = pathspec.GitIgnoreSpec.from_lines(ALWAYS_SKIPPED)
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_CACHE_SIZE = 8
_RACY_NS = 2_000_000_000  # files modified this recently are not cached (coarse mtime clocks)
_EXTRA_SCAN = 10_000  # files still stat'ed after the limit is passed, to name the largest
_cache: OrderedDict[tuple[Any, ...], PackedWorkdir] = OrderedDict()


@dataclass(frozen=True, slots=True)
class PackedWorkdir:
    """A packed working directory: the zip, its identity and what it holds."""

    sha256: str
    data: bytes
    files: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class _Entry:
    rel: str  # posix path relative to the root
    path: Path
    size: int
    mtime_ns: int
    mode: int


def pack_workdir(
    root: Path,
    *,
    file_filter: Any = None,
    use_gitignore: bool = True,
    max_bytes: int = 100 * 1024**2,
) -> PackedWorkdir:
    """Zip the files under ``root`` that a job should see; raise if they exceed ``max_bytes``."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise InvalidArgumentError(f"workdir {str(root)!r} is not a directory", path=str(root))
    started_ns = time.time_ns()
    walk = _walk(root, root, _ignore_for(file_filter), [], use_gitignore)
    entries: list[_Entry] = []
    total = 0
    for entry in walk:
        entries.append(entry)
        total += entry.size
        if total > max_bytes:
            extra = list(itertools.islice(walk, _EXTRA_SCAN))
            _raise_too_big(root, entries + extra, max_bytes, complete=len(extra) < _EXTRA_SCAN)
    stats = tuple((e.rel, e.size, e.mtime_ns, e.mode) for e in entries)
    key = (str(root), stats, _filter_identity(file_filter), use_gitignore)
    if (hit := _cache.get(key)) is not None:
        _cache.move_to_end(key)
        return hit
    packed = _zip(entries)
    if all(e.mtime_ns < started_ns - _RACY_NS for e in entries):
        _cache[key] = packed
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return packed


def unpack_workdir(data: bytes, target: Path) -> None:
    """Extract a packed workdir into ``target``; refuse entries that would land outside it
    (checked before anything is written) and stop at the extraction caps
    (``SHOAL_MAX_EXTRACT_BYTES`` / ``_FILES``), leaving nothing behind."""
    from shoal._internal.archives import extract_zip

    extract_zip(io.BytesIO(data), Path(target),
                label="the job's workdir archive (include_local_workdir)")


def _ignore_for(file_filter: Any) -> Callable[[Path, str, list[str]], set[str]]:
    if file_filter is None:
        return lambda _path, _rel, _names: set()
    if hasattr(file_filter, "ignore_name_patterns"):
        patterns = tuple(file_filter.ignore_name_patterns)

        def by_pattern(_path: Path, rel: str, names: list[str]) -> set[str]:
            return {n for n in names if any(_name_matches(p, n, rel) for p in patterns)}

        return by_pattern
    if callable(file_filter):
        return lambda path, _rel, names: set(file_filter(str(path), list(names)) or ())
    raise InvalidArgumentError(
        "file_filter must be None, a CustomFileFilter or a callable (dirpath, names) -> names "
        f"to ignore; got {type(file_filter).__name__}",
        file_filter=repr(file_filter),
    )


def _name_matches(pattern: str, name: str, rel_dir: str) -> bool:
    """SageMaker's rule (fnmatch on the name), or on the relative path if the pattern has a /."""
    pattern = pattern.rstrip("/")
    subject = (f"{rel_dir}/{name}" if rel_dir else name) if "/" in pattern else name
    return fnmatch.fnmatch(subject, pattern)


def _filter_identity(file_filter: object) -> tuple[str, object]:
    if hasattr(file_filter, "ignore_name_patterns"):
        return ("patterns", tuple(file_filter.ignore_name_patterns))
    return ("object", file_filter) if isinstance(file_filter, Hashable) else ("id", id(file_filter))


def _gitignored(specs: list[tuple[str, Any]], rel: str, is_dir: bool) -> bool:
    """Git's rule: the deepest .gitignore with an opinion wins, and within it the last pattern."""
    ignored = False
    for base, spec in specs:
        sub = rel[len(base) + 1 :] if base else rel
        result = spec.check_file(sub + "/" if is_dir else sub)
        if result.include is not None:
            ignored = result.include
    return ignored


def _walk(
    root: Path,
    directory: Path,
    ignore: Callable[[Path, str, list[str]], set[str]],
    specs: list[tuple[str, Any]],
    use_gitignore: bool,
) -> Iterator[_Entry]:
    rel_dir = directory.relative_to(root).as_posix() if directory != root else ""
    gitignore = directory / ".gitignore"
    if use_gitignore and gitignore.is_file():
        lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
        specs = [*specs, (rel_dir, pathspec.GitIgnoreSpec.from_lines(lines))]
    names = sorted(os.listdir(directory))
    skipped = ignore(directory, rel_dir, names)
    for name in names:
        if name in skipped:
            continue
        path = directory / name
        rel = f"{rel_dir}/{name}" if rel_dir else name
        try:
            link = path.is_symlink()
            if link and not path.resolve().is_relative_to(root):
                continue  # a link leading out of the root is not shipped
            st = path.stat()
        except (OSError, RuntimeError):  # vanished, dangling link, or a link loop
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if _ALWAYS.match_file(f"{name}/" if is_dir else name) or _gitignored(specs, rel, is_dir):
            continue
        if is_dir and not link:  # a directory link inside the root would duplicate (or loop)
            yield from _walk(root, path, ignore, specs, use_gitignore)
        elif stat.S_ISREG(st.st_mode):
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            yield _Entry(rel, path, st.st_size, st.st_mtime_ns, mode)


def _zip(entries: list[_Entry]) -> PackedWorkdir:
    buf = io.BytesIO()
    size = 0
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for e in entries:
            info = zipfile.ZipInfo(e.rel, date_time=_ZIP_DATE)
            info.external_attr = (stat.S_IFREG | e.mode) << 16
            content = e.path.read_bytes()
            size += len(content)
            zf.writestr(info, content, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
    data = buf.getvalue()
    return PackedWorkdir(hashlib.sha256(data).hexdigest(), data, len(entries), size)


def _raise_too_big(root: Path, seen: list[_Entry], max_bytes: int, *, complete: bool) -> NoReturn:
    total = sum(e.size for e in seen)
    largest = heapq.nlargest(5, seen, key=lambda e: e.size)
    listing = ", ".join(f"{e.rel} ({_human(e.size)})" for e in largest)
    amount = _human(total) if complete else f"at least {_human(total)}"
    raise InvalidArgumentError(
        f"working directory {str(root)!r} holds {amount} to ship, over the limit of "
        f"{_human(max_bytes)}; largest files: {listing}. Exclude them with "
        "custom_file_filter=CustomFileFilter(ignore_name_patterns=[...]) or a .gitignore entry, "
        "or keep large data in storage instead of the working directory",
        path=str(root),
        size_bytes=total,
        max_bytes=max_bytes,
        largest=[e.rel for e in largest],
    )


def _human(n: int) -> str:
    size, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
