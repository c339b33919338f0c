"""One pooled keep-alive connection to a team server: authentication, the version check,
timeouts, retries with backoff for idempotent requests only, and errors mapped back to
``shoal.errors`` from the server's ``{"error": {code, message, details}}`` bodies."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import httpx

from shoal.core.api import API_PREFIX, API_VERSION
from shoal.errors import (
    ApiError,
    ConfigError,
    ServerUnreachableError,
    ShoalError,
    error_class_for_code,
)

__all__ = ["API_PREFIX", "API_VERSION", "ServerConnection"]

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
_RETRY_STATUS = frozenset({502, 503, 504})
#: Query parameters: a mapping, or pairs (a name repeated for a list).
Params = Mapping[str, str] | Sequence[tuple[str, str]] | None
#: A request body: bytes, or what makes a fresh iterator of its chunks for each attempt.
Content = bytes | Callable[[], Iterable[bytes]]


class ServerConnection:
    """The HTTP side shared by the port clients of one server URL and token."""

    def __init__(self, url: str, token: str | Callable[[], str | None] | None, *,
                 timeout: float = 30.0, retries: int = 4, backoff: float = 0.1) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"SHOAL_SERVER_URL {url!r} is not an http:// or https:// URL",
                              setting="SHOAL_SERVER_URL", value=url)
        self.url = url.rstrip("/")
        # A callable token is read per request (a warm supervisor's changes with each job).
        self._token = token if callable(token) else None
        headers = {"Authorization": f"Bearer {token}"} if token and not callable(token) else {}
        self._client = httpx.Client(
            base_url=self.url, headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            limits=httpx.Limits(max_keepalive_connections=8, keepalive_expiry=60.0))
        self._retries = retries
        self._backoff = backoff
        self._checked = False
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServerConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _auth(self) -> dict[str, str]:
        token = None if self._token is None else self._token()
        return {} if token is None else {"Authorization": f"Bearer {token}"}

    def check_server(self) -> dict[str, Any]:
        """``GET /api/v1/version``: a clear error when the URL is not a shoal server or one of
        another API version."""
        response = self._send("GET", f"{API_PREFIX}/version", None, None)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("service") != "shoal":
            raise ApiError(f"{self.url} is not a shoal server: GET {API_PREFIX}/version "
                           f"answered {response.status_code} without shoal's version document; "
                           "check SHOAL_SERVER_URL", url=self.url,
                           status_code=response.status_code)
        if body.get("api_version") != API_VERSION:
            raise ApiError(f"the shoal server at {self.url} speaks API version "
                           f"{body.get('api_version')!r}, this client {API_VERSION}; install "
                           f"the shoal version the server runs ({body.get('shoal_version')})",
                           url=self.url, server_api=body.get("api_version"))
        return body

    def call(self, method: str, path: str, *, json: Any = None, params: Params = None) -> Any:
        """Send a request under ``/api/v1`` and return its JSON; a ShoalError otherwise."""
        response = self.request(method, path, json=json, params=params)
        return _json(response) if response.content else None

    def request(self, method: str, path: str, *, json: Any = None, params: Params = None,
                content: Content | None = None, length: int | None = None) -> httpx.Response:
        """Send a request under ``/api/v1`` (its body JSON, or *content* of *length* bytes)
        and return the response read whole; a ShoalError for an error answer."""
        self._check_once()
        response = self._send(method, API_PREFIX + path, json, params, content, length)
        if response.status_code >= 400:
            raise _error(method, path, response)
        return response

    def post_raw(self, path: str, *, content: bytes, headers: Mapping[str, str],
                 timeout: float) -> httpx.Response:
        """``POST`` under ``/api/v1`` once (never retried), its answer whatever its status
        (``error`` makes a ShoalError of the server's own). A server that does not answer is
        a ``ServerUnreachableError``; a read timeout stays ``httpx.ReadTimeout`` (the caller
        names what did not answer)."""
        self._check_once()
        try:
            return self._client.post(API_PREFIX + path, content=content,
                                     headers={**self._auth(), **headers}, timeout=httpx.Timeout(
                                         timeout, connect=min(timeout, 5.0)))
        except httpx.ReadTimeout:
            raise
        except httpx.TransportError as e:
            raise self._unreachable("POST", path, e) from e

    def error(self, method: str, path: str, response: httpx.Response) -> ShoalError:
        """The ShoalError of the server's error answer *response* to *method* *path*."""
        return _error(method, path, response)

    @contextlib.contextmanager
    def download(self, path: str, *, params: Params = None) -> Iterator[httpx.Response]:
        """``GET`` under ``/api/v1`` whose body is read as it comes (``iter_bytes``); a
        ShoalError for an error answer. Retried like any GET until its headers arrive."""
        self._check_once()
        response = self._open_stream(path, params)
        try:
            if response.status_code >= 400:
                response.read()
                raise _error("GET", path, response)
            yield response
        finally:
            response.close()

    def _open_stream(self, path: str, params: Params) -> httpx.Response:
        request = self._client.build_request("GET", API_PREFIX + path, params=_query(params),
                                             headers=self._auth())
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                response = self._client.send(request, stream=True)
            except httpx.TransportError as e:
                if last:
                    raise self._unreachable("GET", path, e) from e
            else:
                if response.status_code not in _RETRY_STATUS or last:
                    return response
                response.close()
            time.sleep(self._backoff * 2 ** attempt)  # backoff between retries
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _check_once(self) -> None:
        if not self._checked:
            with self._lock:
                if not self._checked:
                    self.check_server()
                    self._checked = True

    def _unreachable(self, method: str, path: str, e: Exception) -> ApiError:
        # transient: the session's stores wait it out as a database outage (a restart)
        return ServerUnreachableError(
            f"cannot reach the shoal server at {self.url} ({method} {path}: "
            f"{type(e).__name__}: {e}); is it running, and is SHOAL_SERVER_URL right?",
            url=self.url, transient=True)

    def _send(self, method: str, path: str, body: Any, params: Params,
              content: Content | None = None, length: int | None = None) -> httpx.Response:
        attempts = self._retries + 1 if method in _IDEMPOTENT else 1
        headers = self._auth() if length is None else \
            {**self._auth(), "Content-Length": str(length)}
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                if content is None:
                    response = self._client.request(method, path, json=body,
                                                    params=_query(params), headers=headers)
                else:
                    response = self._client.request(
                        method, path, params=_query(params), headers=headers,
                        content=content if isinstance(content, bytes) else content())
            except httpx.TransportError as e:
                if last:
                    raise self._unreachable(method, path, e) from e
            else:
                if response.status_code not in _RETRY_STATUS or last:
                    return response
            time.sleep(self._backoff * 2 ** attempt)  # backoff between retries
        raise AssertionError("unreachable")  # the last attempt returns or raises


def _query(params: Params) -> httpx.QueryParams | None:
    if params is None:
        return None
    return httpx.QueryParams(params if isinstance(params, Mapping) else tuple(params))


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as e:
        raise ApiError(f"{response.request.method} {response.request.url} answered "
                       f"{response.status_code} with a body that is not JSON",
                       status_code=response.status_code) from e


def _error(method: str, path: str, response: httpx.Response) -> ShoalError:
    try:
        error = response.json()["error"]
        cls = error_class_for_code(str(error["code"]))
        details = error.get("details") or {}
        return cls(str(error["message"]), **(details if isinstance(details, dict) else {}))
    except (ValueError, KeyError, TypeError):
        return ApiError(f"{method} {API_PREFIX}{path} answered {response.status_code}: "
                        f"{response.text[:200]}", status_code=response.status_code)
