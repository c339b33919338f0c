"""What an endpoint's model directory is made of: the model data (a directory, a
``model.tar.gz`` or any fsspec URL), the deployer's code (``entry_point`` / ``source_dir``,
shipped as ``code/`` as SageMaker's repack does) and its own environment.

The client packs the code (``pack_code``); the supervisor stages everything on its machine
(``stage_model``) once for all the endpoint's instances and restarts.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.errors import InvalidArgumentError, MissingExtraError, ServingError, ShoalError

if TYPE_CHECKING:
    from shoal.core.ports import ArtifactStore

__all__ = ["check_model_data", "code_requirements", "is_local", "local_path", "pack_code",
           "requirements_base", "server_requirements", "serving_pythonpath", "ship_model",
           "shipped_key", "stage_model", "upload_model"]

_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def _skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = info.name.split("/")
    return None if "__pycache__" in parts or ".git" in parts else info


def pack_code(archive: Path, *, entry_point: str | None, source_dir: Path | None,
              dependencies: Sequence[Path] = ()) -> None:
    """Write the model's ``code/`` as a tar.gz: *source_dir* (or the entry point alone), the
    dependency directories, and the entry point again as ``inference.py`` when it has another
    name, so the server's ``code/inference.py`` convention finds it."""
    with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
        if source_dir is not None:
            for path in sorted(source_dir.rglob("*")):
                rel = path.relative_to(source_dir)
                if "__pycache__" in rel.parts or ".git" in rel.parts:
                    continue
                tar.add(path, arcname=rel.as_posix(), recursive=False)
        elif entry_point is not None:
            tar.add(entry_point, arcname=Path(entry_point).name)
        for dep in dependencies:
            tar.add(dep, arcname=dep.name, filter=_skip)
        if entry_point is not None and Path(entry_point).name != "inference.py":
            path = source_dir / entry_point if source_dir is not None else Path(entry_point)
            tar.add(path, arcname="inference.py")


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> Path:
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path))
    return Path(uri).expanduser()


def check_model_data(model_data: str) -> None:
    """Fail early, on the client, for a local model_data that is not there."""
    if is_local(model_data):
        path = local_path(model_data)
        if not path.exists():
            raise InvalidArgumentError(f"model_data {model_data} does not exist (looked for "
                                       f"{path.resolve()})", argument="model_data")


def _extract(archive: Path, target: Path, label: str) -> None:
    from shoal._internal.archives import extract_tar

    try:
        # Caps on size and file count (SHOAL_MAX_EXTRACT_*), checked while extracting; no
        # absolute paths, links out or devices; nothing left behind on failure.
        extract_tar(archive, target, label=label)
    except ShoalError as e:
        raise ServingError(f"cannot unpack the model archive: {e}",
                           **{**e.details, "path": str(archive)}) from e


def ship_model(artifacts: ArtifactStore, name: str, model_data: str) -> str:
    """A URL every node (or the team server) can read: *model_data* when it is one, else
    an upload of it (``shipped_key``)."""
    key = shipped_key(name, model_data)
    if key is None:
        return model_data
    upload_model(artifacts, key, model_data)
    return str(artifacts.uri(key))


def shipped_key(name: str, model_data: str) -> str | None:
    """Where a local *model_data* goes in the artifact store (``endpoints/<name>/model/``:
    a file under its name, a directory as ``model.tar.gz``); None for a URL."""
    from shoal.core.endpoints import endpoint_key

    if not is_local(model_data):
        return None
    path = local_path(model_data).resolve()
    return endpoint_key(name, "model", path.name if path.is_file() else "model.tar.gz")


def upload_model(artifacts: ArtifactStore, key: str, model_data: str) -> None:
    """Put the local *model_data* (a file, or a directory packed as a tar.gz) under *key*."""
    path = local_path(model_data).resolve()
    if path.is_file():
        artifacts.put_file(key, path)
        return
    with tempfile.TemporaryDirectory(prefix="shoal-ship-") as tmp:
        archive = Path(tmp) / "model.tar.gz"
        with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
            for item in sorted(path.iterdir()):
                if item.name not in ("__pycache__", ".git"):
                    tar.add(item, arcname=item.name)
        artifacts.put_file(key, archive)


def stage_model(model_data: str, target: Path, *, code_archive: Path | None) -> Path:
    """The directory the server loads: *model_data* itself when it is a local directory and no
    code is added, else a copy or unpacked archive under *target* with ``code/`` added."""
    if target.exists():
        shutil.rmtree(target)
    if is_local(model_data):
        path = local_path(model_data).resolve()
        if path.is_dir():
            if code_archive is None:
                return path
            shutil.copytree(path, target, symlinks=False)
        elif path.is_file():
            _place_file(path, target, f"model_data {model_data}")
        else:
            raise ServingError(f"model_data {model_data} does not exist (looked for {path})",
                               model_data=model_data)
    else:
        _fetch_remote(model_data, target)
    if code_archive is not None:
        code = target / "code"
        if code.exists():  # code from the deployer replaces what the archive held
            shutil.rmtree(code)
        _extract(code_archive, code, "the deployer's code (entry_point / source_dir)")
    return target


def _place_file(path: Path, target: Path, label: str) -> None:
    if path.name.endswith(_TAR_SUFFIXES):
        _extract(path, target, label)
    else:  # a bare model file (model.onnx, model.joblib...)
        target.mkdir(parents=True)
        shutil.copy2(path, target / path.name)


def _fetch_remote(uri: str, target: Path) -> None:
    import fsspec.core

    from shoal._internal.extras import require_for_url

    require_for_url(uri, f"model_data {uri}")
    try:
        fs, path = fsspec.core.url_to_fs(uri)
        if fs.isdir(path):
            target.mkdir(parents=True)
            fs.get(path.rstrip("/") + "/", str(target), recursive=True)
            return
        if not fs.exists(path):
            raise ServingError(f"model_data {uri} does not exist", model_data=uri)
        with tempfile.TemporaryDirectory(prefix="shoal-model-") as tmp:
            local = Path(tmp) / Path(path).name
            fs.get(path, str(local))
            _place_file(local, target, f"model_data {uri}")
    except (ServingError, MissingExtraError):
        raise
    except Exception as e:  # fsspec backends raise their own types (botocore, OSError...)
        raise ServingError(f"cannot fetch model_data {uri}: {type(e).__name__}: {e}. For "
                           "s3:// install shoal[s3].", model_data=uri) from e


def code_requirements(model_dir: Path) -> str | None:
    """``code/requirements.txt`` of the model, when it has one."""
    path = model_dir / "code" / "requirements.txt"
    return path.read_text() if path.is_file() else None


def requirements_base(model_dir: Path) -> Path:
    """Where relative paths in the model's requirements resolve: its ``code/`` directory, or
    the model directory when it has no code."""
    code = model_dir / "code"
    return code if code.is_dir() else model_dir


def server_requirements(distributions: Sequence[str],
                        wanted: Sequence[str] = ()) -> tuple[str, ...]:
    """The model server's own packages, pinned to the versions the client runs, so the
    model's environment serves exactly as the client's would; a package the *wanted*
    requirement texts name is theirs (a framework's ``numpy<2`` beats the client's numpy)."""
    from importlib.metadata import PackageNotFoundError, version

    named = _requirement_names(wanted)
    pins = []
    for dist in distributions:
        if _canonical(dist) in named:
            continue
        try:
            pins.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            pins.append(dist)
    return tuple(pins)


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def _requirement_names(texts: Sequence[str]) -> set[str]:
    from packaging.requirements import InvalidRequirement, Requirement

    names = set()
    for line in "\n".join(texts).splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            try:
                names.add(_canonical(Requirement(line).name))
            except InvalidRequirement:
                continue
    return names


def serving_pythonpath(root: Path) -> Path:
    """A directory holding shoal's package, for an isolated environment's PYTHONPATH
    (``shoal.envs.ensure_package_path``)."""
    from shoal.envs import ensure_package_path

    return ensure_package_path(root)
