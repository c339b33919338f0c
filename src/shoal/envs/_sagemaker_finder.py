"""``import sagemaker`` imports shoal, and ``sagemaker.X`` imports ``shoal.X`` (one module
object under both names), unless a real ``sagemaker`` package is installed.

Standard library only: shoal copies this file into a job's environment as
``_shoal_sagemaker_alias.py``, imported at interpreter start by a ``.pth`` line (or by the small
``sagemaker`` package shoal puts on a job's PYTHONPATH when the interpreter is the client's).
Importing it only registers the finder; shoal itself is imported on ``import sagemaker``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

ALIAS = "sagemaker"
TARGET = "shoal"
MARKER = "_shoal_sagemaker_alias.py"


class _Existing(importlib.abc.Loader):
    """Hands the import system the already-imported ``shoal.X`` for ``sagemaker.X``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: Any) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        return None


def _real_sagemaker() -> bool:
    spec = importlib.machinery.PathFinder.find_spec(ALIAS)
    if spec is None or not spec.origin:
        return False
    # shoal's own stand-in package sits beside this file's copy; it is not a real sagemaker.
    parent = os.path.dirname(os.path.dirname(spec.origin))
    return not os.path.exists(os.path.join(parent, MARKER))


class SagemakerAliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        if fullname == ALIAS:
            if _real_sagemaker():
                return None
        elif getattr(sys.modules.get(ALIAS), "__name__", None) != TARGET:
            return None  # the real sagemaker is the one imported
        name = TARGET + fullname[len(ALIAS):]
        try:
            if importlib.util.find_spec(name) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Existing(name))


def install() -> None:
    """Register the finder (first on ``sys.meta_path``, once)."""
    if not any(type(f).__name__ == "SagemakerAliasFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, SagemakerAliasFinder())


if __name__ == "_shoal_sagemaker_alias":  # the copy in a job's environment, not shoal's own
    install()
