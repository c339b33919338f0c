"""The job's work directory: what the job handed back there, the copies removed once its
outcome is stored, and what the job keeps on disk (its stored artifacts and that directory).

The supervisor writes the job's payloads into its work directory for the job's process, and
the process writes its result there; once the job has ended and its outcome is stored, those
copies (and channels copied from a remote store, and a script's model and output data once
uploaded) only take space: a 1 GB argument would otherwise stay on disk three times.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal.core.ports import ArtifactStore, JobStore

__all__ = ["PAYLOAD_COPIES", "collect", "drop_copies", "job_disk_usage"]

#: Files of the work-directory protocol (``_entrypoint.py``): copies of stored payloads.
PAYLOAD_COPIES = tuple(f"{kind}.{ext}" for kind in ("function", "arguments", "results",
                                                     "exception") for ext in ("pkl", "json")
                       ) + ("exception.summary.json", "shoal_error.json", ".results.pkl.tmp",
                            ".results.json.tmp", ".exception.pkl.tmp", ".exception.json.tmp")


def drop_copies(workdir: Path, *, script: bool = False, uploaded: bool = False,
                empty: bool = False) -> None:
    """Remove from *workdir* what the store holds (or held only for the job's process): the
    payload files, channels that were copied (linked ones are left alone), and, for a
    script whose outputs were uploaded, ``model/`` and ``output/data/``. What else the job
    left there stays, for the user to look at; with *empty*, *workdir* itself goes when
    nothing is left in it (a directory is a disk block, and most jobs leave nothing)."""
    for name in PAYLOAD_COPIES:
        with contextlib.suppress(FileNotFoundError):
            (workdir / name).unlink()
    if script:
        _drop_script_copies(workdir, uploaded)
    if empty:
        with contextlib.suppress(OSError):  # not empty (the job's own files), or gone
            workdir.rmdir()


def _drop_script_copies(workdir: Path, uploaded: bool) -> None:
    channels = workdir / "input" / "data"
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(channels):
            path = Path(entry.path)
            if entry.is_symlink():
                continue  # a local channel, linked: not ours to delete
            if entry.is_dir(follow_symlinks=False) and not _holds_links(path):
                shutil.rmtree(path, ignore_errors=True)
    if uploaded:
        for sub in ("model", "output/data"):
            shutil.rmtree(workdir / sub, ignore_errors=True)
            (workdir / sub).mkdir(parents=True, exist_ok=True)


def _holds_links(path: Path) -> bool:
    """A channel directory holding a link to a local file (staged by linking, not copying)."""
    return any(p.is_symlink() for p in path.iterdir())


def _tree_bytes(path: Path) -> int:
    """Bytes of the files under *path* (links not followed); 0 when it does not exist."""
    if path.is_symlink() or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                if not os.path.islink(os.path.join(root, name)):
                    total += st.st_size
    return total


def job_disk_usage(artifacts: ArtifactStore, work_root: Path, name: str,
                   metadata: JobStore | None = None) -> dict[str, int]:
    """``{"artifact_bytes", "database_bytes", "workdir_bytes", "total_bytes"}`` of job
    *name*: what the artifact store holds under its prefix, the small payloads the metadata
    store holds for it (``jobs/_payloads.py``), and its work directories and local log on
    this machine."""
    stored = int(artifacts.disk_usage(name))
    inline = int(metadata.job_payload_bytes(name)) if metadata is not None else 0
    local = sum(_tree_bytes(p) for p in Path(work_root).glob(f"{name}.*")
                if p.name == f"{name}.log" or p.name[len(name) + 1:].split(".")[0].isdigit())
    return {"artifact_bytes": stored, "database_bytes": inline, "workdir_bytes": local,
            "total_bytes": stored + inline + local}


def collect(workdir: Path, inline: dict[str, Any] | None
             ) -> tuple[str | None, tuple[bytes, bytes] | None, dict[str, Any]]:
    """What the job handed back: from a warm executor's answer, or from its files."""
    if inline is not None:
        kind = inline.get("kind") or ("error" if inline.get("error") else None)
        detail = inline.get("summary") or inline.get("error") or {}
        return kind, inline.get("payload"), detail
    for kind in ("results", "exception"):
        if (workdir / f"{kind}.json").exists():
            blobs = ((workdir / f"{kind}.pkl").read_bytes(),
                     (workdir / f"{kind}.json").read_bytes())
            detail = _read_json(workdir / "exception.summary.json") if kind == "exception" else {}
            return kind, blobs, detail
    if (workdir / "shoal_error.json").exists():
        return "error", None, _read_json(workdir / "shoal_error.json")
    return None, None, {}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
