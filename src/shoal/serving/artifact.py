"""Where a model server finds its model: a directory, a ``model.tar.gz``, or an fsspec URL of
either. Archives and remote copies land in a private temporary directory that the server
removes when it stops.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import ModelLoadError, ShoalError

__all__ = ["ResolvedModel", "resolve_model"]


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A local model directory; ``temp_dir`` is ours to delete (None: the caller's own)."""

    path: Path
    temp_dir: Path | None = None

    def cleanup(self) -> None:
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def resolve_model(uri: str | os.PathLike[str]) -> ResolvedModel:
    """A local directory for *uri*: used in place when it is one, else fetched/extracted."""
    text = os.fspath(uri)
    if "://" not in text or text.startswith("file://"):
        path = Path(text.removeprefix("file://")).expanduser()
        if path.is_dir():
            return ResolvedModel(path.resolve())
        if path.is_file():
            temp = _private_dir()
            try:
                return ResolvedModel(_extract(path, temp / "model"), temp)
            except BaseException:
                shutil.rmtree(temp, ignore_errors=True)
                raise
        raise ModelLoadError(f"model {text} does not exist; give a model directory, a "
                             f"model.tar.gz, or a URL of either", uri=text)
    return _fetch(text)


def _fetch(url: str) -> ResolvedModel:
    import fsspec

    temp = _private_dir()
    try:
        fs, remote = fsspec.core.url_to_fs(url)
        if fs.isdir(remote):
            target = temp / "model"
            fs.get(remote.rstrip("/") + "/", str(target) + "/", recursive=True)
            return ResolvedModel(target, temp)
        if fs.isfile(remote):
            archive = temp / "model.tar.gz"
            fs.get(remote, str(archive))
            resolved = _extract(archive, temp / "model")
            archive.unlink()
            return ResolvedModel(resolved, temp)
        raise ModelLoadError(f"model {url} does not exist", uri=url)
    except ModelLoadError:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    except Exception as e:  # fsspec backends raise their own (botocore, gcsfs, OSError)
        shutil.rmtree(temp, ignore_errors=True)
        raise ModelLoadError(f"cannot fetch model {url}: {type(e).__name__}: {e}",
                             uri=url) from e


def _private_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="shoal-model-"))  # mode 0700


def _extract(archive: Path, target: Path) -> Path:
    import tarfile

    from shoal._internal.archives import extract_tar

    if not tarfile.is_tarfile(archive):
        raise ModelLoadError(f"{archive} is neither a directory nor a tar archive (model.tar.gz)",
                             path=str(archive))
    try:
        # Caps on size and file count, checked while extracting; no absolute paths, "..",
        # links out of the tree or device files; nothing left behind on failure.
        # The caps: SHOAL_MAX_EXTRACT_BYTES / _FILES (the server runs without Settings).
        extract_tar(archive, target)
    except ShoalError as e:
        raise ModelLoadError(f"cannot extract the model: {e}",
                             **{**e.details, "path": str(archive)}) from e
    entries = list(target.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and entries[0].name != "code":
        return entries[0]  # an archive of one top-level directory
    return target
