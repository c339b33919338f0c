"""The model server's refusals: one exception carrying an HTTP status, and its JSON body.

Only the server's own ASGI app turns these into responses; they never leave the process.
"""

from __future__ import annotations

import json

__all__ = ["RequestError", "error_body"]


class RequestError(Exception):
    """A request the server answers with *status* and ``{"error": error, "detail": detail}``."""

    def __init__(self, status: int, error: str, detail: str,
                 headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers


def error_body(error: str, detail: str) -> bytes:
    return json.dumps({"error": error, "detail": detail}).encode()


def bad_request(detail: str) -> RequestError:
    return RequestError(400, "bad request", detail)


def model_error(exc: BaseException) -> RequestError:
    """424, SageMaker's status for "the model raised", with the model's own message."""
    message = str(exc) or type(exc).__name__
    return RequestError(424, "model error", f"{type(exc).__name__}: {message}")
