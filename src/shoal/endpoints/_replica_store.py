"""Where a Ray Serve replica reads its endpoint's files and writes its log.

An endpoint deployed by a session reads them from the artifact store by URL (``model_uri``,
``code_uri``, ``requirements_uri``, ``logs_uri``), with the credentials its replicas got from
the client's environment. An endpoint a team server started gets none of the server's
credentials and no store settings: its spec names the server (``server``: its URL for the
nodes and a replica token, ``server/_jobtokens.py``) and the keys (``model_key``,
``code_key``, ``requirements_key``, ``logs_key``); the replica fetches them through the
server's artifact routes first (``fetch_through_server``: the spec it returns names the
local copies), and uploads its log there (``log_writer``). So no node needs to reach the
server's stores, or hold their credentials, to serve a team server's endpoint.

Imports no ray; runs on the replica.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from shoal.errors import ServingError

if TYPE_CHECKING:
    from shoal.client import HttpArtifactStore

__all__ = ["fetch_through_server", "log_writer", "through_server"]


def through_server(spec: Mapping[str, Any]) -> bool:
    """Whether *spec* is a team server's (its files are fetched through it)."""
    return bool(spec.get("server"))


def _store(spec: Mapping[str, Any]) -> HttpArtifactStore:
    from shoal.client import HttpArtifactStore

    server = spec["server"]
    return HttpArtifactStore.open(str(server["url"]), str(server["token"]))


def fetch_through_server(spec: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """Fetch the endpoint's model, code and requirements through the server into
    ``root/fetched``; return *spec* naming those copies (``model_uri`` a local path, the
    others ``file://`` URLs), as a session's spec names its store's."""
    fetched = root / "fetched"
    fetched.mkdir(parents=True, exist_ok=True)
    out = dict(spec)
    with _store(spec) as store:
        out["model_uri"] = str(_fetch_model(store, str(spec["model_key"]), fetched / "model"))
        for key_field, uri_field, local in (("code_key", "code_uri", "code.tar.gz"),
                                            ("requirements_key", "requirements_uri",
                                             "requirements.txt")):
            key = spec.get(key_field)
            if key:
                store.get_file(str(key), fetched / local)
                out[uri_field] = (fetched / local).resolve().as_uri()
    return out


def _fetch_model(store: HttpArtifactStore, key: str, target: Path) -> Path:
    """The model at *key*: one file (a ``model.tar.gz``, a bare model file) as it is, or
    every key under it as a directory."""
    if store.exists(key):
        target.mkdir(parents=True, exist_ok=True)
        local = target / PurePosixPath(key).name
        store.get_file(key, local)
        return local
    prefix = key.rstrip("/") + "/"
    keys = store.list_keys(prefix)
    if not keys:
        raise ServingError(f"model_data {store.uri(key)} does not exist in the shoal server's "
                           "artifact store", model_data=key)
    for found in keys:
        rel = PurePosixPath(found[len(prefix):])
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ServingError(f"the server listed {found!r} under {prefix!r}: not a key "
                               "under the model's", model_data=key)
        local = target.joinpath(*rel.parts)
        local.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(found, local)
    return target


def log_writer(spec: Mapping[str, Any]) -> Callable[[str, bytes], None] | None:
    """How the replica writes a file of its log (by name) where the endpoint's logs go:
    through the server, or to ``logs_uri``; None when the spec names neither."""
    if through_server(spec):
        if not spec.get("logs_key"):
            return None
        logs = str(spec["logs_key"]).rstrip("/")

        def put(name: str, data: bytes) -> None:
            with _store(spec) as store:
                store.put_bytes(f"{logs}/{name}", data)

        return put
    uri = spec.get("logs_uri")
    if not uri:
        return None

    def write(name: str, data: bytes) -> None:
        import fsspec

        with fsspec.open(f"{str(uri).rstrip('/')}/{name}", "wb") as f:
            f.write(data)

    return write
