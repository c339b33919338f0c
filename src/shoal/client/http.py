"""One pooled keep-alive connection to a team server: authentication, the version check,
timeouts, retries with backoff for idempotent requests only, and errors mapped back to
``shoal.errors`` from the server's ``{"error": {code, message, details}}`` bodies."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from shoal.errors import (
    ApiError,
    ConfigError,
    ServerUnreachableError,
    ShoalError,
    error_class_for_code,
)

__all__ = ["API_PREFIX", "API_VERSION", "ServerConnection"]

#: The API version this client speaks; the server's ``GET /api/v1/version`` must match.
API_VERSION = 1
API_PREFIX = f"/api/v{API_VERSION}"
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
_RETRY_STATUS = frozenset({502, 503, 504})


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

    def _check_once(self) -> None:
        if not self._checked:
            with self._lock:
                if not self._checked:
                    self.check_server()
                    self._checked = True

    def _headers(self) -> dict[str, str] | None:
        token = None if self._token is None else self._token()
        return None if token is None else {"Authorization": f"Bearer {token}"}

    @contextlib.contextmanager
    def stream(self, method: str, path: str, *, params: Mapping[str, str] | None = None
               ) -> Iterator[httpx.Response]:
        """A streamed response under ``/api/v1`` (its body read as it comes); a ShoalError
        for an error status, ServerUnreachableError when the server cannot be reached."""
        self._check_once()
        try:
            with self._client.stream(method, API_PREFIX + path, params=params,
                                     headers=self._headers(),
                                     timeout=httpx.Timeout(None, connect=5.0)) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error(method, path, response)
                yield response
        except httpx.TransportError as e:
            raise ServerUnreachableError(
                f"lost the shoal server at {self.url} ({method} {path}: {type(e).__name__}: "
                f"{e})", url=self.url, transient=True) from e

    def call(self, method: str, path: str, *, json: Any = None,
             params: Mapping[str, str] | None = None) -> Any:
        """Send a request under ``/api/v1`` and return its JSON; a ShoalError otherwise."""
        self._check_once()
        response = self._send(method, API_PREFIX + path, json, params)
        if response.status_code >= 400:
            raise _error(method, path, response)
        return _json(response) if response.content else None

    def _send(self, method: str, path: str, body: Any,
              params: Mapping[str, str] | None) -> httpx.Response:
        attempts = self._retries + 1 if method in _IDEMPOTENT else 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._client.request(method, path, json=body, params=params,
                                                headers=self._headers())
            except httpx.TransportError as e:
                if last:
                    raise ServerUnreachableError(
                        f"cannot reach the shoal server at {self.url} ({method} {path}: "
                        f"{type(e).__name__}: {e}); is it running, and is SHOAL_SERVER_URL "
                        "right?", url=self.url, transient=True) from e
            else:
                if response.status_code not in _RETRY_STATUS or last:
                    return response
            time.sleep(self._backoff * 2 ** attempt)  # backoff between retries
        raise AssertionError("unreachable")  # the last attempt returns or raises


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
