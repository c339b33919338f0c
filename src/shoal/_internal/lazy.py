"""PEP 562 lazy exports: a package names where each public attribute lives, and the module
holding it is imported on first use (so ``import shoal`` and friends stay light)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str], namespace: MutableMapping[str, Any],
                 names: Sequence[str], submodules: Sequence[str] = ()
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for *package*: *where* maps a name to its module; a
    loaded value is cached in *namespace* (the package's globals). Each of *submodules* is
    imported on first attribute access (``import shoal as sagemaker; sagemaker.s3``), as
    SageMaker's package has them imported already."""

    def __getattr__(name: str) -> Any:
        if name in submodules:
            value = importlib.import_module(f"{package}.{name}")
            namespace[name] = value
            return value
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*names, *submodules})

    return __getattr__, __dir__
