"""``sagemaker`` as an alias of shoal inside a framework job, as SageMaker's containers have it.

SageMaker's framework containers ship the ``sagemaker`` SDK, so a training script may do
``from sagemaker.experiments.run import load_run``. Inside a shoal framework job that name is
shoal, through the finder of ``shoal._sagemaker_alias`` (the one ``shoal alias install`` uses):

- ``write_sagemaker_alias_pth(site_packages)``: into an environment shoal built, the same two
  files ``shoal alias install --target`` writes (``_shoal_sagemaker_alias.py`` and
  ``shoal-sagemaker-alias.pth``), so ``shoal alias status|uninstall`` see them;
- ``sagemaker_alias_dir(root)``: a directory for the job's ``PYTHONPATH`` (that module and a
  ``sagemaker`` stand-in package that becomes shoal), for a job on the client's own
  interpreter, whose site-packages shoal does not change.

Neither is used where a real ``sagemaker`` is installed: that one is imported.
``shoal_requirements()`` pins shoal's own dependencies to the client's versions, so that an
environment with shoal's package on its path can import it.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

__all__ = ["ALIAS_MODULE", "PTH_FILE", "PTH_LINE", "has_real_sagemaker", "sagemaker_alias_dir",
           "shoal_requirements", "write_sagemaker_alias_pth"]

ALIAS_MODULE = "_shoal_sagemaker_alias"
# The names and line cli/_alias.py ('shoal alias install') writes; a test holds them equal.
PTH_FILE = "shoal-sagemaker-alias.pth"
PTH_LINE = f"import {ALIAS_MODULE}; {ALIAS_MODULE}.install()\n"
_FINDER = Path(__file__).resolve().parent.parent / "_sagemaker_alias.py"
_STAND_IN = (f"import sys\n\nimport {ALIAS_MODULE}\n\n"
             f"{ALIAS_MODULE}.install()  # for sagemaker.X\n"
             "import shoal  # noqa: E402\n\nsys.modules[__name__] = shoal\n")
# shoal's own dependencies (pyproject's), less uv: a job builds no environments.
_SHOAL_DEPS = ("cloudpickle", "fsspec", "sqlalchemy", "alembic", "pydantic", "pydantic-settings",
               "pyyaml", "typer", "rich", "httpx", "packaging", "pathspec", "plotext")


def _write(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def has_real_sagemaker(site_packages: Path) -> bool:
    return (site_packages / "sagemaker").is_dir() or any(
        site_packages.glob("sagemaker-*.dist-info"))


def write_sagemaker_alias_pth(site_packages: Path) -> bool:
    """Make ``import sagemaker`` import shoal in the environment of *site_packages*; False
    (and nothing written) when a real sagemaker is installed there."""
    from shoal._sagemaker_alias import MARKER

    if has_real_sagemaker(site_packages):
        return False
    _write(site_packages / f"{ALIAS_MODULE}.py", _FINDER.read_text())
    _write(site_packages / PTH_FILE, f"# {MARKER}: 'import sagemaker' imports shoal\n{PTH_LINE}")
    return True


def sagemaker_alias_dir(root: Path) -> Path:
    """A directory to put first on a job's PYTHONPATH so ``import sagemaker`` imports shoal."""
    finder = _FINDER.read_text()
    digest = hashlib.sha256((finder + _STAND_IN).encode()).hexdigest()[:16]
    target = Path(root) / digest
    if (target / "sagemaker" / "__init__.py").exists():
        return target
    tmp = Path(root) / f".tmp-{uuid.uuid4().hex}"
    (tmp / "sagemaker").mkdir(parents=True)
    (tmp / f"{ALIAS_MODULE}.py").write_text(finder)
    (tmp / "sagemaker" / "__init__.py").write_text(_STAND_IN)
    try:
        os.rename(tmp, target)
    except OSError:  # another job put the same directory in place first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target


def shoal_requirements() -> tuple[str, ...]:
    """shoal's dependencies pinned to the versions the client runs."""
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for dist in _SHOAL_DEPS:
        try:
            pins.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            pins.append(dist)
    return tuple(pins)
