"""``import sagemaker`` as shoal: a meta-path finder that maps ``sagemaker`` and
``sagemaker.*`` to the ``shoal`` modules of the same path, so unmodified SageMaker code
(``from sagemaker.remote_function import remote``) runs on shoal.

``shoal alias install`` copies this file into the environment's site-packages as
``_shoal_sagemaker_alias.py`` beside a ``.pth`` line that calls its ``install()`` at startup;
it imports only the standard library, so starting Python costs little more until ``sagemaker``
is imported.
The module objects are shoal's own (``sagemaker.Session is shoal.Session``): nothing is loaded
twice.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

MARKER = "shoal-sagemaker-alias"
_ALIAS, _TARGET = "sagemaker", "shoal"


class SageMakerAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``sagemaker[.X]`` and loads it as the module ``shoal[.X]``."""

    def find_spec(self, fullname: str, path: Any = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _ALIAS and not fullname.startswith(_ALIAS + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        name = _TARGET + spec.name[len(_ALIAS):]
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            raise ModuleNotFoundError(
                f"No module named {spec.name!r}: shoal (installed as the 'sagemaker' alias) has "
                f"no {name}; docs/sagemaker-compat.md lists what it provides",
                name=spec.name) from None

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the shoal module is already loaded."""


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, SageMakerAlias) or type(f).__name__ == "SageMakerAlias"
               for f in sys.meta_path):
        sys.meta_path.insert(0, SageMakerAlias())

