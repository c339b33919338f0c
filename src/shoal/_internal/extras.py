"""Optional packages and the extra that brings each: one place that turns a missing optional
import into ``MissingExtraError`` naming ``pip install "shoal[EXTRA]"``.

Two ways in, both cheap when the packages are there:

- ``require(extra, feature, *modules)`` checks up front (``importlib.util.find_spec``, nothing
  imported), for entry points that must fail before they start anything (``shoal serve``
  before it listens, ``Model.deploy`` before it starts an instance);
- ``needs_extra(extra, feature)`` as a context manager or decorator around a feature's code:
  a ``ModuleNotFoundError`` for an optional package raised inside it (however deep the lazy
  import) becomes ``MissingExtraError``. Missing stdlib or shoal modules are bugs, re-raised.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator

from shoal.errors import MissingExtraError

__all__ = ["DISTRIBUTIONS", "LLM_SERVER_MODULES", "SERVER_MODULES", "install_hint", "missing",
           "needs_extra", "require", "require_for_url"]

#: What every model server imports, whatever the model (the ``serve`` extra brings them).
SERVER_MODULES = ("uvicorn", "httptools", "numpy", "prometheus_client")
#: What the LLM server imports before it loads a model (the ``llm`` extra brings them).
#: (httptools: the servers' guarded HTTP protocol, serving/_guard.py)
LLM_SERVER_MODULES = ("uvicorn", "httptools", "prometheus_client")

#: import name -> distribution name, where they differ (for the message).
DISTRIBUTIONS = {
    "sklearn": "scikit-learn", "skl2onnx": "skl2onnx", "yaml": "pyyaml",
    "prometheus_client": "prometheus-client", "psycopg": "psycopg", "PIL": "pillow",
    "huggingface_hub": "huggingface-hub",
}


def install_hint(extra: str) -> str:
    return f'pip install "shoal[{extra}]"'


def _message(feature: str, module: str, extra: str) -> str:
    dist = DISTRIBUTIONS.get(module, module)
    return (f"{feature} needs {dist}, which is not installed; install the '{extra}' extra: "
            f"{install_hint(extra)}")


def missing(*modules: str) -> list[str]:
    """Those of *modules* (import names) that cannot be imported here."""
    out = []
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                out.append(name)
        except (ImportError, ValueError):  # a parent package missing, or a broken __spec__
            out.append(name)
    return out


def require(extra: str, feature: str, *modules: str) -> None:
    """Raise ``MissingExtraError`` naming *extra* unless every one of *modules* is importable."""
    absent = missing(*modules)
    if absent:
        raise MissingExtraError(_message(feature, absent[0], extra), extra=extra,
                                module=absent[0], feature=feature)


#: fsspec protocols whose implementation an extra brings: protocol -> (extra, module).
PROTOCOLS = {"s3": ("s3", "s3fs"), "s3a": ("s3", "s3fs")}


def require_for_url(url: str, feature: str) -> None:
    """``require`` the extra that brings *url*'s fsspec implementation (``s3://``: s3fs)."""
    protocol = url.partition("://")[0].lower() if "://" in url else ""
    if protocol in PROTOCOLS:
        extra, module = PROTOCOLS[protocol]
        require(extra, feature, module)


def _is_optional(name: str | None) -> bool:
    top = (name or "").partition(".")[0]
    return bool(top) and top != "shoal" and top not in sys.stdlib_module_names


@contextlib.contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """Within the block (or the decorated function), a missing optional package raises
    ``MissingExtraError`` naming *extra*; an inner ``MissingExtraError`` passes unchanged."""
    try:
        yield
    except MissingExtraError:
        raise
    except ModuleNotFoundError as e:
        if not _is_optional(e.name):
            raise
        top = (e.name or "").partition(".")[0]
        raise MissingExtraError(_message(feature, top, extra), extra=extra, module=top,
                                feature=feature) from e
